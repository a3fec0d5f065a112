"""benchmarks/gap_whole.py (decision 129): its dual-feasible-function rows hold for every packing, so the MILP's dual
bound is at most the least packed step time, and its packed plan is a real plan (never under that optimum)."""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from tidal.planner.bounds import PipeCost
from tidal.proof.binpack import min_bins

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def gw():
    sys.path.insert(0, str(BENCH))
    try:
        import gap_whole
    finally:
        sys.path.remove(str(BENCH))
    return gap_whole


def _partitions(total: int, most: int):
    """Every multiset of positive integers <= most summing to total (non-increasing tuples)."""
    if total == 0:
        yield ()
        return
    for first in range(min(total, most), 0, -1):
        for rest in _partitions(total - first, first):
            yield (first, *rest)


def test_dual_feasible_functions_sum_to_at_most_one_per_micro_batch(gw):
    for cap in (12, 17):
        for total in range(1, cap + 1):
            for part in _partitions(total, cap):
                for name, e in gw.DFF:
                    assert gw.dff(name, np.array(part), cap, e).sum() <= 1 + 1e-12, (cap, part, name, e)


def test_whole_milp_bound_and_packed_plan_bracket_the_least_packed_time(gw):
    rng = np.random.default_rng(7)
    pipes = [PipeCost(1e-4, 0.01, 0.05, 1, 20), PipeCost(1e-4, 0.01, 0.05, 1, 20), PipeCost(5e-5, 0.006, 0.08, 1, 32)]
    for _ in range(4):
        l_ = rng.integers(3, 21, size=6).astype(np.int64)
        best = np.inf
        for assign in itertools.product(range(len(pipes)), repeat=l_.size):
            t = 0.0
            for j, p in enumerate(pipes):
                g = l_[[i for i, a in enumerate(assign) if a == j]]
                if g.size and int(g.max()) > p.max_len:
                    t = np.inf
                    break
                if g.size:
                    t = max(t, min_bins(g, p.max_len)[0] * p.c + float(p.work(g).sum()))
            best = min(best, t)
        groups, V, T, dual = gw.whole_milp(l_, pipes, 30.0, True)
        assert groups is not None and best * (1 + 1e-6) >= T  # the rows relax every packed plan
        if np.isfinite(dual):
            assert dual <= best * (1 + 1e-6)
        got, _ = gw.pack_all(l_, pipes, groups, V, 10.0, 8)
        assert np.isnan(got) or got >= best * (1 - 1e-9)  # a packed plan is never faster than the optimum
