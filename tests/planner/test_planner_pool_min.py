"""proof.pool.pool_min_bound (decision 128): the min-T model's dual bound never exceeds the exact optimum over whole-
document dispatches (brute force on tiny steps; with the count rows, over every dispatch and packing), at any time
limit, in both encodings; it is exact when every document is kept whole and the solve ends; it answers hi where no
dispatch meets hi, and never leaves [lo, hi]."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_planner_exact_feasible import KINDS, optimum
from test_planner_pool_counts import plan_opt

from tidal.proof.pool import pool_bound, pool_min_bound, pool_solve

pytestmark = [pytest.mark.unit]


def _step(kinds, reps, seed, n):
    pipes = [KINDS[k] for k, r in zip(kinds, reps) for _ in range(r)][:4]
    rng = np.random.default_rng(seed)
    return pipes, rng.integers(1, max(p.max_len for p in pipes) + 1, size=n)


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(KINDS))), min_size=1, max_size=2, unique=True),
       st.lists(st.integers(1, 3), min_size=2, max_size=2), st.integers(0, 2**31 - 1), st.integers(1, 5),
       st.integers(1, 3), st.sampled_from([20.0, 1e-3]))
def test_min_bound_never_exceeds_the_optimum(kinds, reps, seed, n, nb, limit):
    # identical pipelines, so that slots and pools both occur; a time limit of 1 ms stops most solves early, where
    # the dual bound is all that is left: it must stay sound
    pipes, lengths = _step(kinds, reps, seed, n)
    opt = optimum(lengths, pipes)
    if not np.isfinite(opt):
        assert pool_min_bound(lengths, pipes, 1.0, 1e9, limit, nb=nb) == pytest.approx(1e9 * (1 - 1e-6))
        return
    lo, hi = 0.5 * opt, 1.05 * opt
    for whole in (0, 1, None, n):
        for compact in (False, True):
            b = pool_min_bound(lengths, pipes, lo, hi, limit, nb=nb, whole=whole, compact=compact)
            assert lo <= b <= opt
            # the bisection finished by one min-T solve on the interval it leaves: no higher than the optimum, and
            # (where the solves end, so that both bisections take the same path) no lower than the bisection alone
            fin = pool_bound(lengths, pipes, lo, hi, limit, iters=3, nb=nb, whole=whole, compact=compact, finish=True)
            assert lo <= fin <= opt
            if limit > 1:
                assert pool_bound(lengths, pipes, lo, hi, limit, iters=3, nb=nb, whole=whole, compact=compact) <= fin
    if limit > 1:  # every document whole and the solve finished: the model is milp.dispatch_feasible's, with T free
        assert pool_min_bound(lengths, pipes, lo, hi, limit, nb=nb, whole=n) >= opt * (1 - 1e-5)
        # hi under the optimum: no dispatch meets hi, so the bound is hi
        assert pool_min_bound(lengths, pipes, lo, 0.99 * opt, limit, nb=nb, whole=n) == pytest.approx(
            0.99 * opt * (1 - 1e-6))


@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([0, 1, 3, 4, 5]), min_size=1, max_size=2, unique=True),
       st.lists(st.integers(1, 2), min_size=2, max_size=2), st.integers(0, 2**31 - 1), st.integers(1, 5),
       st.integers(1, 3))
def test_min_bound_with_counts_never_exceeds_the_packed_optimum(kinds, reps, seed, n, nb):
    pipes, lengths = _step(kinds, reps, seed, n)
    pipes = pipes[:3]
    opt = plan_opt(lengths, pipes)
    if not np.isfinite(opt):
        return
    for whole in (0, None, n):
        for compact in (False, True):
            b = pool_min_bound(lengths, pipes, 0.5 * opt, 1.05 * opt, 20.0, nb=nb, whole=whole, counts=True,
                               compact=compact)
            assert 0.5 * opt <= b <= opt


def test_min_bound_matches_the_bisection_and_reports_its_solution():
    # 14 documents on 9 pipelines of three kinds: with every document whole, the min-T model's optimum is the exact
    # relaxed optimum, which pool_bound's bisection approaches from below; its solution's T is >= its dual bound
    rng = np.random.default_rng(7)
    pipes = [KINDS[0]] * 5 + [KINDS[1]] * 3 + [KINDS[3]]
    lengths = rng.integers(1, 101, size=14)
    exact = pool_bound(lengths, pipes, 0.0, 1000.0, iters=16, gap=0.0, whole=lengths.size)
    b = pool_min_bound(lengths, pipes, 0.5 * exact, 2 * exact, 30.0, whole=lengths.size)
    assert exact * (1 - 1e-3) <= b <= exact * (1 + 1e-3)
    st_, sol = pool_solve(lengths, pipes, 2 * exact, 30.0, tvar=(0.5 * exact, 2 * exact))
    assert st_ == "feasible" and sol["dual"] <= sol["T"] * (1 + 1e-6)
    assert sorted(i for _, docs in sol["slots"] for i in docs) + sorted(
        i for pos, _ in sol["fluid"] for i in pos) == sorted(range(lengths.size))
    # the pooled relaxation (documents fluid) proves no more than the exact model
    for whole in (0, 4, None):
        assert pool_min_bound(lengths, pipes, 0.5 * exact, 2 * exact, 30.0, whole=whole) <= exact * (1 + 1e-3)


@pytest.mark.parametrize("kinds", [[0] * 6, [1] * 4, [0] * 4 + [1] * 3])
def test_min_bound_on_pools_stays_near_the_bisection(kinds):
    # every document fluid (whole=0): only pools, whose T x count products are relaxed (module doc); the min-T model
    # relaxes the fixed-T one at every T <= hi, so it proves at most pool_bound's threshold, and with the pools'
    # McCormick row about as much (0.948-0.997 of it here; without the row, nothing above lo)
    pipes = [KINDS[k] for k in kinds]
    lengths = np.random.default_rng(3).integers(1, 60, size=30)
    exact = pool_bound(lengths, pipes, 0.0, 1e4, iters=30, gap=0.0, whole=0)
    for compact in (False, True):
        b = pool_min_bound(lengths, pipes, 0.5 * exact, 1.5 * exact, 30.0, whole=0, compact=compact)
        assert 0.94 * exact <= b <= exact * (1 + 1e-3)
