"""proof.forced (decision 145): the forced-document MILP never proves a T that some whole-document dispatch meets (brute
force over every dispatch of tiny steps, identical pipelines included so that slots occur), never says more than the
exact MILP (proof.milp) on a step too large for brute force; in prove_selection it keeps the plan and stays under it
(test_planner_pool_bound.test_prove_selection_with_a_milp_keeps_the_plan_and_stays_under_it[forced]); its dual
feasible functions' weights never sum above 1 on a pipeline's worth of work, and their rows prove what the work rows
alone do not (decision 153)."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_planner_exact_feasible import KINDS, optimum

from tidal.planner.bounds import PipeCost
from tidal.proof.forced import KIND_DFF, dff_weight, forced_bound, forced_feasible, forced_solve
from tidal.proof.milp import dispatch_feasible

pytestmark = [pytest.mark.unit]

MANY = KIND_DFF + (1 / 3, 0.05, 0.15, 0.25, 0.35, 0.45)  # every row the proof uses, and lambdas off its 0.02 grid


@settings(max_examples=50, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(KINDS))), min_size=1, max_size=2, unique=True),
       st.lists(st.integers(1, 3), min_size=2, max_size=2), st.integers(0, 2**31 - 1), st.integers(1, 5),
       st.integers(1, 3))
@pytest.mark.parametrize("dff, slot_rows", [((), True), (MANY, True), (MANY, False)],
                         ids=["slots", "slots+dff", "kinds+dff"])
def test_forced_never_proves_a_time_some_dispatch_meets(dff, slot_rows, kinds, reps, seed, n, nb):
    pipes = [KINDS[k] for k, r in zip(kinds, reps) for _ in range(r)][:4]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max(p.max_len for p in pipes) + 1, size=n)
    opt = optimum(lengths, pipes)
    if not np.isfinite(opt):
        assert forced_feasible(lengths, pipes, 1e9, nb=nb, dff=dff, slot_rows=slot_rows) == "infeasible"
        return
    for f in (1.0005, 1.03):
        assert forced_feasible(lengths, pipes, opt * f, time_limit=20.0, nb=nb, dff=dff,
                               slot_rows=slot_rows) != "infeasible"
    b = forced_bound(lengths, pipes, 0.5 * opt, opt * 1.05, time_limit=20.0, iters=8, nb=nb, dff=dff,
                     slot_rows=slot_rows)
    assert 0.5 * opt <= b <= opt


def test_forced_says_no_more_than_the_exact_milp_and_proves_something():
    # 14 documents on 9 pipelines of three kinds (5 identical one-stage ones that the longest documents do not fit
    # near the exact optimum): the forced bound is at most the exact MILP's optimum (by bisection), above the longest
    # document alone on its cheapest pipeline, and at each T under it that the forced MILP proves infeasible the exact
    # MILP (every document whole) proves infeasible too
    rng = np.random.default_rng(7)
    pipes = [KINDS[3]] * 5 + [KINDS[1]] * 3 + [KINDS[0]]
    lengths = rng.integers(1, 121, size=14)
    a, b = 0.0, 1000.0  # the exact optimum of dispatch_feasible, by bisection
    for _ in range(14):
        m = 0.5 * (a + b)
        if dispatch_feasible(lengths, pipes, m)[0] == "infeasible":
            a = m
        else:
            b = m
    got = forced_bound(lengths, pipes, 0.0, 1000.0, iters=14, gap=0.0)
    assert got <= a * (1 + 1e-9)
    assert got > min(p.c + p.w1(float(lengths.max())) for p in pipes)
    for f in (0.5, 0.9, 0.999):
        assert forced_feasible(lengths, pipes, got * f) == "infeasible"
        assert dispatch_feasible(lengths, pipes, got * f)[0] == "infeasible"


def test_forced_solution_places_each_forced_document_once_and_feasible_on_a_realistic_step():
    # lengths of 1 to 32k tokens on the 1024-GPU mixed candidate's kinds (one-stage; pool.py's realistic-step test):
    # at a generous T a dispatch exists, so the relaxation must be feasible (its rows' scaling), and its solution
    # places each forced document on exactly one slot of a kind it fits
    kinds = [PipeCost(1.2677e-10, 9.0587e-06, 0.0848, 1, 359122), PipeCost(4.6359e-10, 2.6066e-05, 0.06944, 1, 85162),
             PipeCost(1.7674e-09, 9.2762e-05, 0.05152, 1, 16723), PipeCost(3.5348e-09, 1.8048e-04, 0.04768, 1, 8361)]
    pipes = [kinds[0]] * 2 + [kinds[1]] * 6 + [kinds[2]] * 12 + [kinds[3]] * 30
    rng = np.random.default_rng(3)
    lengths = np.minimum(np.ceil(np.exp(rng.normal(6.5, 1.6, size=300))), 32000).astype(np.int64)
    avg = float(sum(kinds[3].work(lengths))) / len(pipes)
    T = 3 * avg + kinds[0].c + kinds[0].w1(float(lengths.max()))
    st_, sol = forced_solve(lengths, pipes, T, time_limit=30.0)
    assert st_ == "feasible" and sol["forced"] > 0
    placed = sorted(i for _, docs in sol["slots"] for i in docs)
    assert placed == list(range(sol["forced"]))
    for ki, docs in sol["slots"]:
        p = sol["kinds"][ki]
        assert sum(p.w1(float(lengths[sol["order"][i]])) for i in docs) <= T - p.c + 1e-6
    # far below the longest document's time on its fastest pipeline nothing fits: infeasible without a solve
    assert forced_feasible(lengths, pipes, kinds[0].c + kinds[0].w1(float(lengths.max())) * 0.5) == "infeasible"



def test_dff_weights_never_sum_above_one():
    # 20,000 sets of up to 8 works (in capacities) summing to at most 1, drawn from every step of the functions in
    # MANY (j / (k + 1), lambda, 1 - lambda), those nudged by +-1e-9, +-1e-6, +-0.01, and uniform ones: the weights
    # of every function sum to <= 1 on each set
    steps = {Fraction(j, k + 1) for k in range(1, 6) for j in range(1, k + 1)} | {Fraction(f).limit_denominator(100)
                                                                                 for f in MANY if f < 1}
    pts = [float(x) + e for x in steps | {1 - x for x in steps} for e in (0.0, 1e-9, -1e-9, 1e-6, -1e-6, 0.01, -0.01)]
    rng = np.random.default_rng(5)
    for _ in range(20000):
        xs: list[float] = []
        for _ in range(int(rng.integers(1, 9))):
            x = float(rng.choice(pts)) if rng.random() < 0.8 else float(rng.random())
            if x > 0 and sum(xs) + x <= 1:
                xs.append(x)
        for f in MANY:
            assert sum(g0 + g1 * x for x in xs for g0, g1 in [dff_weight(x, f)]) <= 1 + 1e-12, (f, xs)
    assert dff_weight(0.51, 1) == (1.0, 0.0) and dff_weight(0.5, 1) == (0.0, 0.0)
    assert dff_weight(0.9, 0.2) == (1.0, 0.0) and dff_weight(0.5, 0.2) == (0.0, 1.0) and dff_weight(0.1, 0.2)[0] == 0


def test_dff_rows_prove_what_the_work_rows_do_not():
    # three documents of just over half a pipeline's capacity on two identical one-stage pipelines that every one
    # fits: no document is forced, so without the rows the work (1.5 pipelines' worth) fits the kind's two pipelines;
    # the heavy row (k = 1) counts 3 > 2 pipelines. The optimum is two documents on one pipeline.
    p = PipeCost(0.0, 1.0, 0.1, 1, 1000)
    lengths = np.array([52, 52, 52])
    T = 0.1 + 1.0 * 52 / 0.51  # cap = T - c = 102: each document is 0.51 of it
    assert forced_feasible(lengths, [p, p], T) == "feasible"
    for slot_rows in (True, False):
        assert forced_feasible(lengths, [p, p], T, dff=(1,), slot_rows=slot_rows) == "infeasible"
        assert forced_feasible(lengths, [p, p], T, dff=KIND_DFF, slot_rows=slot_rows) == "infeasible"
    assert optimum(lengths, [p, p]) > T
