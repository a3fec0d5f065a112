"""benchmarks/gap_whole.py (decision 129): its dual-feasible-function rows hold for every packing, so the MILP's dual
bound is at most the least packed step time, and its packed plan is a real plan (never under that optimum)."""

import numpy as np
import pytest

from _packed_brute import bench_module, small_steps, three_pipes  # isort: skip


@pytest.fixture(scope="module")
def gw():
    return bench_module("gap_whole")


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
    pipes = three_pipes()
    for l_, best in small_steps(7, 4, 6, pipes):
        groups, V, T, dual = gw.whole_milp(l_, pipes, 30.0, True)
        assert groups is not None and best * (1 + 1e-6) >= T  # the rows relax every packed plan
        if np.isfinite(dual):
            assert dual <= best * (1 + 1e-6)
        got, _ = gw.pack_all(l_, pipes, groups, V, 10.0, 8)
        assert np.isnan(got) or got >= best * (1 - 1e-9)  # a packed plan is never faster than the optimum
