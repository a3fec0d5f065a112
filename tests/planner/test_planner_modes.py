"""The mode-aware step bound (proof.modes, decision 57): never above a plan's estimate (property test on generated
instances, tiny MaxLen and d > 0 included) and never above the true optimum (brute force over every dispatch and every
packing of small instances); with it, the LP-priced proof after planning (proof.lp.prove_selection)."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_synth import PROFILES

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost, StrategyBound, pipeline_bound
from tidal.planner.select import StrategyProfile, assign, select_step
from tidal.proof.lp import lp_bound, prove_selection
from tidal.proof.modes import infeasible, mode_bound

pytestmark = pytest.mark.unit

SETTINGS = dict(derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

pipe_st = st.builds(PipeCost, st.sampled_from([0.0, 1e-5, 1e-3]), st.sampled_from([0.0, 1e-2, 1.0]),
                    st.sampled_from([0.0, 0.01, 0.5]), st.integers(1, 4),
                    st.sampled_from([3, 8, 20, 40, 64, 150, 300]),  # tiny MaxLen included
                    st.sampled_from([0.0, 0.0, 0.02, 0.5]))


def _profile(pipes):
    # assign() only reads strategy.pipelines[j].scheme/devices for the PipelinePlan; reuse a synthetic one's shape
    from tidal.core import get_cluster, parse_strategy, place

    text = "+".join(["tp1"] * len(pipes))
    strat = place(parse_strategy(text), get_cluster("cpux16"))
    return StrategyProfile(strat, tuple(pipes), tuple((8,) for _ in pipes))


def plan_and_bound(lengths, pipes) -> tuple[float, StrategyBound] | None:
    """(estimate of assign's plan, StrategyBound) of a generated instance; None when a length fits no pipeline."""
    if max(lengths) > max(p.max_len for p in pipes):
        return None
    l_ = np.asarray(lengths, dtype=np.int64)
    return assign(l_, _profile(pipes))[0], StrategyBound(l_, pipes)


@settings(max_examples=600, **SETTINGS)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
       pipes=st.lists(pipe_st, min_size=1, max_size=5))
def test_mode_bound_never_above_a_plan(lengths, pipes):
    planned = plan_and_bound(lengths, pipes)
    if planned is None:
        return
    est, sb = planned
    lo = sb.refined()
    assert not infeasible(est * (1 + 1e-9), sb, sb.Y0), "a plan of time est exists"
    assert mode_bound(sb, lo, 2 * est + 1.0) <= est * (1 + 1e-9)
    assert mode_bound(sb, 0.0, 2 * est + 1.0) <= est * (1 + 1e-9)
    assert lp_bound(sb, lo, 2 * est + 1.0) <= est * (1 + 1e-9)  # the LP-priced certificates (proof.lp)
    assert lp_bound(sb, 0.5 * lo, 2 * est + 1.0) <= est * (1 + 1e-9)


def _best_packing(ls, p: PipeCost) -> float:
    """Optimal (PP - 1 + V) * max micro-batch time over every set partition with micro-batches <= MaxLen."""
    best = float("inf")
    n = len(ls)

    def rec(i, blocks):
        nonlocal best
        if i == n:
            if blocks:
                tau = max(p.c + sum(p.w1(x) for x in b) for b in blocks)
                best = min(best, (p.pp - 1 + len(blocks)) * tau)
            return
        for b in blocks:
            if sum(b) + ls[i] <= p.max_len:
                b.append(ls[i])
                rec(i + 1, blocks)
                b.pop()
        blocks.append([ls[i]])
        rec(i + 1, blocks)
        blocks.pop()

    rec(0, [])
    return best if n else 0.0


def _optimum(lengths, pipes) -> float:
    best = float("inf")
    for asg in itertools.product(range(len(pipes)), repeat=len(lengths)):
        if any(lengths[i] > pipes[j].max_len for i, j in enumerate(asg)):
            continue
        t = 0.0
        for j, p in enumerate(pipes):
            t = max(t, _best_packing([lengths[i] for i, jj in enumerate(asg) if jj == j], p))
            if t >= best:
                break
        best = min(best, t)
    return best


def brute_force_cases(seed: int, count: int):
    """(lengths, pipes, optimum) of `count` seeded small instances (<= 6 documents on <= 3 pipelines of 5 kinds)."""
    rng = np.random.default_rng(seed)
    kinds = [PipeCost(1e-3, 1.0, 0.5, 1, 64), PipeCost(0.5e-3, 0.5, 0.5, 2, 128), PipeCost(2e-3, 2.0, 0.1, 1, 12),
             PipeCost(1e-3, 1.0, 0.2, 1, 20, 5.0), PipeCost(1e-4, 0.2, 0.05, 3, 40)]
    for _ in range(count):
        pipes = [kinds[rng.integers(0, len(kinds))] for _ in range(rng.integers(1, 4))]
        top = max(p.max_len for p in pipes)
        lengths = [int(x) for x in rng.integers(1, top + 1, size=rng.integers(1, 7))]
        yield lengths, pipes, _optimum(lengths, pipes)


def test_mode_bound_vs_brute_force_optimum():
    tighter = 0
    for lengths, pipes, opt in brute_force_cases(70, 150):
        sb = StrategyBound(np.asarray(lengths), pipes)
        assert sb.refined() <= opt * (1 + 1e-9)
        old = sb.refined(top=0)  # the work terms alone: on <= 6 documents the top-documents term is already exact
        new = mode_bound(sb, old, 2 * opt + 1.0)
        assert new <= opt * (1 + 1e-9), (lengths, pipes, new, opt)
        assert not infeasible(opt * (1 + 1e-9), sb, sb.Y0)
        tighter += new > old * (1 + 1e-6)
    assert tighter >= 10  # it does raise the bound on such instances


def test_big_document_holds_a_small_pipeline_to_one_micro_batch():
    # a PP = 2 pipeline of MaxLen 20 holding a 19-token document can run one micro-batch only (two would take 3 x
    # that document's time instead of 2 x), so the other documents must go to the second pipeline. (PP = 1 before
    # decision 94; one stage now costs the sum of its micro-batches, so a second one costs only c more.)
    pipes = [PipeCost(0.0, 1.0, 0.01, 2, 20), PipeCost(0.0, 1.0, 0.01, 2, 20)]
    lengths = [19, 19] + [3] * 10
    sb = StrategyBound(np.asarray(lengths), pipes)
    old = sb.refined(top=0)
    new = mode_bound(sb, old, 100.0)
    assert new <= _optimum(lengths, pipes) * (1 + 1e-9)
    assert new > old * 1.05


@settings(max_examples=300, **SETTINGS)
@given(lengths=st.lists(st.integers(1, 600), min_size=1, max_size=40), k=st.integers(0, len(PROFILES) - 1))
def test_proof_raises_the_bound_and_keeps_the_plan(lengths, k):
    # the proof after planning (proof.lp.prove_selection: the mode bound and LP-priced certificates, decisions 61,
    # 154) only raises the reported bounds, never above the estimate, and never changes the plan
    profiles = [PROFILES[k], PROFILES[(k + 3) % len(PROFILES)]]
    if max(lengths) > max(p.max_len for p in profiles):
        return
    sel = select_step(lengths, profiles)
    proven = prove_selection(lengths, profiles, sel)
    assert proven.plan.est_step_time * (1 + 1e-9) >= proven.plan.lower_bound >= sel.plan.lower_bound
    assert proven.plan.to_dict(timings=False)["pipelines"] == sel.plan.to_dict(timings=False)["pipelines"]
    assert proven.plan.est_step_time == sel.plan.est_step_time
    for a, b in zip(sel.strategies, proven.strategies, strict=True):
        assert b.lower_bound >= a.lower_bound and b.est_step_time == a.est_step_time
    with pytest.raises(TidalError, match="3 profiles were given"):  # profiles that are not the selection's
        prove_selection(lengths, [*profiles, profiles[0]], sel)


def test_one_pipeline_strategy_bound_is_at_least_its_pipeline_bound():
    # one pipeline holds every document, so the step bound includes pipeline_bound of all of them: V >= tokens /
    # MaxLen micro-batches. One stage sums them (decision 94): V_min c + W exactly, more than twice the longest
    # document's c + w. The work and mode terms relax V (modes mix fractionally).
    p = PipeCost(1e-4, 1e-3, 0.01, 1, 100)
    lengths = np.array([95, 90] + [10] * 30)
    sb = StrategyBound(lengths, [p])
    est = assign(lengths, _profile([p]))[0]
    assert pipeline_bound(lengths, p) == pytest.approx(5 * p.c + float(p.work(lengths).sum()))  # V_min = 5
    assert pipeline_bound(lengths, p) > sb.lb_doc * 2
    assert pipeline_bound(lengths, p) * (1 - 1e-9) <= sb.quick <= sb.refined() <= est * (1 + 1e-9)
