"""Micro-batch integrality in the proof (decision 123): proof.binpack's counts against brute force, and the pooled
MILP with its count rows (proof.pool, `counts=True`, with and without the compact one-stage encoding) never proves a
T that some packed plan meets (brute force over every dispatch and every packing of tiny steps), while it proves more
than without them where documents longer than half a MaxLen cannot share a micro-batch."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_planner_exact_feasible import KINDS

from tidal.planner.bounds import PipeCost
from tidal.planner.packing import pipeline_time
from tidal.proof.binpack import fits_bins, l2_bins, min_bins
from tidal.proof.pool import pool_bound, pool_feasible

pytestmark = [pytest.mark.unit]


def partitions(items):
    """Every set partition of `items` (a list)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]
        yield [[first]] + part


def least_bins(lengths, cap):
    return min(len(p) for p in partitions(list(range(len(lengths))))
               if all(sum(lengths[i] for i in mb) <= cap for mb in p))


def packed_opt(lengths, p: PipeCost) -> float:
    """The least packed time (packing.pipeline_time) of these documents on pipeline p, over every packing."""
    if len(lengths) == 0:
        return 0.0
    if max(lengths) > p.max_len:
        return np.inf
    return min(pipeline_time(lengths, [tuple(mb) for mb in part], p.coeffs, p.pp)
               for part in partitions(list(range(len(lengths))))
               if all(sum(lengths[i] for i in mb) <= p.max_len for mb in part))


def plan_opt(lengths, pipes) -> float:
    """min over every dispatch and every packing of the step time (the slowest pipeline's packed time)."""
    n = len(lengths)
    cache = {}

    def t(j, mask):
        key = (pipes[j], mask)
        if key not in cache:
            cache[key] = packed_opt(np.array([lengths[i] for i in range(n) if mask >> i & 1], dtype=np.int64),
                                    pipes[j])
        return cache[key]

    best = np.inf
    for a in itertools.product(range(len(pipes)), repeat=n):
        masks = [sum(1 << i for i in range(n) if a[i] == j) for j in range(len(pipes))]
        best = min(best, max(t(j, m) for j, m in enumerate(masks)))
    return best


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=7), st.integers(100, 160))
def test_bin_counts_against_brute_force(lengths, cap):
    l_ = np.array(lengths, dtype=np.int64)
    opt = least_bins(lengths, cap)
    assert l2_bins(l_, cap) <= opt
    assert min_bins(l_, cap, upper=len(lengths)) == (opt, "optimal")
    assert fits_bins(l_, cap, opt) == "feasible"
    assert fits_bins(l_, cap, opt - 1) == "infeasible"


def test_l2_counts_the_long_documents():
    # three documents over half the capacity need three micro-batches whatever their tokens; L2 sees it, the token
    # count does not; a fourth short one fits beside one of them
    assert l2_bins([60, 55, 51, 30], 100) == 3
    assert min_bins(np.array([60, 55, 51, 30]), 100, upper=4) == (3, "optimal")


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([0, 1, 3, 4, 5]), min_size=1, max_size=2, unique=True),
       st.lists(st.integers(1, 2), min_size=2, max_size=2), st.integers(0, 2**31 - 1), st.integers(1, 5),
       st.integers(1, 3))
def test_pool_counts_never_prove_a_time_some_plan_meets(kinds, reps, seed, n, nb):
    # one-stage, two-stage, per-document d and Eq. 1 kinds; lengths up to the longest MaxLen, so documents over a
    # half and a third of a MaxLen are common
    pipes = [KINDS[k] for k, r in zip(kinds, reps) for _ in range(r)][:3]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max(p.max_len for p in pipes) + 1, size=n)
    opt = plan_opt(lengths, pipes)
    if not np.isfinite(opt):
        assert pool_feasible(lengths, pipes, 1e9, nb=nb, counts=True) == "infeasible"
        return
    for whole in (0, None, n):
        for compact in (False, True):
            assert pool_feasible(lengths, pipes, opt * 1.0005, time_limit=20.0, nb=nb, whole=whole, counts=True,
                                 compact=compact) != "infeasible"
    for compact in (False, True):
        b = pool_bound(lengths, pipes, 0.5 * opt, opt * 1.05, time_limit=20.0, iters=6, nb=nb, counts=True,
                       compact=compact)
        assert 0.5 * opt <= b <= opt


def test_pool_counts_prove_more_where_long_documents_cannot_share():
    # two one-stage pipelines of MaxLen 64; six documents of 40 tokens: each needs its own micro-batch, so the best
    # plan runs 3 on each (3 c + W); the relaxed cost counts ceil(120 / 64) = 2 micro-batches. Without the count rows
    # the pooled MILP cannot prove more than the relaxed optimum; with them it proves the packed one
    p = KINDS[0]
    pipes = [p, p]
    lengths = np.full(6, 40)
    opt = plan_opt(lengths, pipes)
    w = float(p.w1(40.0))
    assert opt == pytest.approx(3 * p.c + 3 * w)
    relaxed = 2 * p.c + 3 * w
    mid = 0.5 * (relaxed + opt)
    assert pool_feasible(lengths, pipes, relaxed * 1.0001, whole=0) == "feasible"
    assert pool_feasible(lengths, pipes, relaxed * 1.0001, whole=6) == "feasible"
    for whole in (0, 6):
        for compact in (False, True):
            assert pool_feasible(lengths, pipes, mid, whole=whole, counts=True, compact=compact) == "infeasible"
    assert pool_bound(lengths, pipes, relaxed, opt * 1.01, iters=8, counts=True) > mid
    assert pool_bound(lengths, pipes, relaxed, opt * 1.01, iters=8, counts=True, compact=True) > mid


def test_prove_selection_with_counts_keeps_the_plan_and_stays_under_it():
    # the llama2-13b a800x16 mixed candidate's kinds (one-stage; cp2's MaxLen 2,073, tp1's 1,036): documents of
    # 1.1k-2k tokens fit cp2 and tp2 only, one per cp2 micro-batch; the count rows see that, the LP does not
    from test_planner_modes import _profile

    from tidal.planner.select import select_step
    from tidal.proof.lp import prove_selection

    cp2 = PipeCost(2.7343589743589745e-09, 0.0001772963308278525, 0.0644, 1, 2073)
    tp2 = PipeCost(2.8430769230769233e-09, 0.0001824505042545895, 0.0724, 1, 8403)
    tp1 = PipeCost(5.468717948717949e-09, 0.00034670562699588473, 0.0596, 1, 1036)
    rng = np.random.default_rng(5)
    lengths = np.concatenate([rng.integers(1100, 2000, size=8), rng.integers(20, 700, size=20)])
    prof = [_profile([cp2, tp2, tp1, tp1])]
    sel = select_step(lengths, prof)
    est = sel.plan.est_step_time
    lp = prove_selection(lengths, prof, sel)
    counted = prove_selection(lengths, prof, sel, pool_s=10.0, pool_counts=True)
    assert lp.plan.lower_bound * 1.001 < counted.plan.lower_bound <= est  # 1.0026 -> 1.0010 of the plan
    assert counted.plan.to_dict(timings=False)["pipelines"] == sel.plan.to_dict(timings=False)["pipelines"]
    # the modes' encoding runs after the compact one only to raise the bound: never below the compact one's alone
    compact = pool_bound(lengths, prof[0].pipes, lp.plan.lower_bound, est, 10.0, counts=True, compact=True)
    assert counted.plan.lower_bound >= compact
