"""The one-stage pricing rule is a property of the pipeline's cost (decision 97): Tidal prices a PP = 1 pipeline at
the sum of its micro-batches, V c + W (decision 94); the Hydraulis baseline (PipeCost.eq1) by its paper's Eq. 1,
V x its slowest micro-batch. The rule rides on pipecost.stage_q's q into the same formulas, compiled and plain."""

import numpy as np
import pytest
from planner_synth import formula_cases

from tidal.planner import pipecost
from tidal.planner.alg1 import dispatch_hydraulis
from tidal.planner.bounds import Eq1Coeffs, PipeCost
from tidal.planner.dispatch import dispatch
from tidal.planner.packing import pack, pipeline_time

pytestmark = pytest.mark.unit

Q = pipecost.EQ1_Q


def _fns():
    fns = [{n: getattr(pipecost, n) for n in ("pipe_value", "packed_value", "best_v", "greedy_cost", "add_cost")}]
    try:
        from tidal.planner import kernels
        if kernels.AVAILABLE:
            fns.append(kernels.compile_pipecost())
    except ImportError:  # pragma: no cover
        pass
    return fns


def test_stage_q_marks_only_one_stage_eq1_pipelines():
    assert pipecost.stage_q(1) == 0.0 and pipecost.stage_q(1, True) == Q > 0
    assert pipecost.stage_q(4) == pipecost.stage_q(4, True) == 3.0
    assert PipeCost(1.0, 1.0, 1.0, 1, 10, eq1=True).q == Q and PipeCost(1.0, 1.0, 1.0, 1, 10).q == 0.0
    assert type(PipeCost(1.0, 1.0, 1.0, 1, 10, eq1=True).coeffs) is Eq1Coeffs
    assert PipeCost.of(PipeCost(1.0, 2.0, 3.0, 1, 10, 0.5, True).coeffs, 1, 10).eq1


@pytest.mark.parametrize("mode", [0, 1], ids=["plain", "compiled"])
def test_eq1_formulas_are_v_times_the_slowest_micro_batch(mode):
    """q = EQ1_Q: f(V) = V max(W / V + c, c + w_max) exactly (Eq. 1), minimised at V_min; compiled = plain."""
    fns = _fns()
    if mode >= len(fns):
        pytest.skip("numba not installed")
    f = fns[mode]
    for _, c, M, W, tok, wm, cnt, g in formula_cases(300, 7):
        vmin = max(1, -(-tok // M))
        vmax = max(vmin, cnt)
        for v in (vmin, vmax):
            assert f["pipe_value"](Q, c, W, wm, v) == v * max(W / v + c, c + wm)
            assert f["packed_value"](Q, c, W, c + wm, v) == v * (c + wm)
        v, val = f["best_v"](Q, c, W, wm, vmin, vmax)  # f does not decrease with V: V_min (or a float tie, c = 0)
        assert val == f["pipe_value"](Q, c, W, wm, v) == pytest.approx(vmin * max(W / vmin + c, c + wm), rel=1e-12)
        assert v == vmin or c == 0
        v0 = max(vmin, g)
        assert f["greedy_cost"](Q, c, M, W, tok, wm, cnt, g) == pytest.approx(v0 * max(W / v0 + c, c + wm), rel=1e-12)
        assert f["add_cost"](c, Q, M, W, tok, wm, cnt, g, M // 3, wm / 2, False) == \
            fns[0]["add_cost"](c, Q, M, W, tok, wm, cnt, g, M // 3, wm / 2, False)


def test_one_stage_estimate_follows_each_rule_with_a_dominant_document():
    """A PP = 1 pipeline whose MaxLen forces V >= 2 and one document dominates: Tidal's estimate is V c + W (the sum),
    the baseline's is Eq. 1, V x the slowest micro-batch, for the packer, pipeline_time and the dispatch alike."""
    tidal = PipeCost(2e-10, 1e-5, 0.02, 1, 1000)
    hyd = PipeCost(2e-10, 1e-5, 0.02, 1, 1000, eq1=True)
    l_ = np.array([950, 300, 200, 200, 100, 100, 80])
    for pc in (tidal, hyd):
        res = pack(l_, pc.coeffs, 1, pc.max_len)
        times = [pc.coeffs.mb_time(l_[list(mb)]) for mb in res.micro_batches]
        assert len(times) >= 2
        want = len(times) * max(times) if pc.eq1 else sum(times)
        assert res.est_time == pytest.approx(want, rel=1e-12)
        assert pipeline_time(l_, res.micro_batches, pc.coeffs, 1) == pytest.approx(want, rel=1e-12)
    assert pack(l_, hyd.coeffs, 1, 1000).est_time > pack(l_, tidal.coeffs, 1, 1000).est_time
    # the dispatch's estimate (capacity-aware cost of the greedy + local search) follows the pipeline's rule too
    loads_t = dispatch(l_, [tidal]).objective
    loads_h = dispatch(l_, [hyd]).objective
    w = tidal.work(l_)
    assert loads_t == pytest.approx(2 * tidal.c + w.sum(), rel=1e-12)  # V_min = 2 micro-batches, summed
    assert loads_h == pytest.approx(2 * max(w.sum() / 2 + tidal.c, tidal.c + w.max()), rel=1e-12)
    # Alg. 1's dispatch, re-scored with the pipelines' own rule
    assert dispatch_hydraulis(l_, [hyd], trials=1).objective == pytest.approx(loads_h, rel=1e-12)
    assert dispatch_hydraulis(l_, [tidal], trials=1).objective == pytest.approx(loads_t, rel=1e-12)


def test_pp2_is_priced_alike():
    a = PipeCost(2e-10, 1e-5, 0.02, 2, 1000)
    b = PipeCost(2e-10, 1e-5, 0.02, 2, 1000, eq1=True)
    l_ = np.array([950, 300, 200, 200, 100, 100, 80])
    assert pack(l_, a.coeffs, 2, 1000) == pack(l_, b.coeffs, 2, 1000)
    assert dispatch(l_, [a, a]) == dispatch(l_, [b, b])


def test_step_planner_prices_the_hydraulis_baseline_by_eq1():
    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel import default_cost_model
    from tidal.planner.profiles import profile_strategies

    model, cluster = get_model("llama2-7b"), get_cluster("a800x16")
    cands = [place(parse_strategy("tp8+tp4+4*tp1"), cluster, model)]
    cm = default_cost_model(model, cluster)
    assert all(p.eq1 for p in profile_strategies(cands, cm, eq1=True)[0].pipes)
    assert not any(p.eq1 for p in profile_strategies(cands, cm)[0].pipes)


def test_step_planner_estimates_follow_the_pipelines_rule():
    """StepPlanner(eq1=True) (the simulator's `hydraulis` system) estimates each PP = 1 pipeline of its plan as V x
    its slowest micro-batch; eq1=False (Tidal) as their sum; set_cost_model keeps the rule."""
    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel import default_cost_model
    from tidal.data.sampler import TokenBudgetSampler
    from tidal.data.sources import length_source
    from tidal.planner.stepper import PlanningOptions, StepPlanner

    model, cluster = get_model("llama2-7b"), get_cluster("a800x16")
    cm = default_cost_model(model, cluster)
    cands = [place(parse_strategy("tp8+tp4+4*tp1"), cluster, model)]
    opts = PlanningOptions(max_len=16384, tokens_per_step=120_000)
    multi = 0
    for eq1 in (False, True):
        src = TokenBudgetSampler(length_source("synthetic:commoncrawl", 0), 120_000, 16384, seed=0)
        sp = StepPlanner(cm, cands, src, opts, eq1=eq1)
        sp.set_cost_model(cm)
        assert all(p.eq1 == eq1 for p in sp.profiles[0].pipes)
        plan = sp.next().plan
        lens = np.asarray(plan.seq_lengths)
        for pl, pc in zip(plan.pipelines, sp.profiles[0].pipes):
            if pl.pp != 1 or len(pl.micro_batches) < 2:
                continue
            multi += 1
            times = [pc.coeffs.mb_time(lens[list(mb)]) for mb in pl.micro_batches]
            want = len(times) * max(times) if eq1 else sum(times)
            assert pl.est_time == pytest.approx(want, rel=1e-9)
    assert multi >= 2  # both rules were checked on a pipeline of several micro-batches
