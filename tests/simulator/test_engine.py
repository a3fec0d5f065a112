"""Simulator engine: a hand-computed 1F1B and GPipe schedule, the uniform closed form, determinism, accounting."""

import numpy as np
import pytest

from tidal.core.cluster import get_cluster
from tidal.core.model import get_model
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.simulator.engine import BWD, FWD, SimConfig, Simulator, run_pipeline, stage_order

pytestmark = pytest.mark.unit


def _ops(res):
    st, mb, kind, start, end = res
    return {(int(s), "FB"[int(k)], int(m)): (float(a), float(b)) for s, m, k, a, b in zip(st, mb, kind, start, end)}


def test_1f1b_matches_hand_schedule():
    # pp=2, v=3, forward 1 s, backward 2 s, P2P 0.5 s each way; worked out by hand in docs/simulator.md
    f, b = np.ones((2, 3)), 2 * np.ones((2, 3))
    ops = _ops(run_pipeline(f, b, 0.5 * np.ones((1, 3)), np.zeros(2), "1f1b"))
    hand = {
        (0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (0, "B", 0): (5, 7), (0, "F", 2): (7, 8), (0, "B", 1): (8, 10),
        (0, "B", 2): (12, 14),
        (1, "F", 0): (1.5, 2.5), (1, "B", 0): (2.5, 4.5), (1, "F", 1): (4.5, 5.5), (1, "B", 1): (5.5, 7.5),
        (1, "F", 2): (8.5, 9.5), (1, "B", 2): (9.5, 11.5),
    }
    assert ops == hand


def test_gpipe_matches_hand_schedule():
    f, b = np.ones((2, 3)), 2 * np.ones((2, 3))
    ops = _ops(run_pipeline(f, b, 0.5 * np.ones((1, 3)), np.zeros(2), "gpipe"))
    hand = {
        (0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (0, "F", 2): (2, 3),
        (1, "F", 0): (1.5, 2.5), (1, "F", 1): (2.5, 3.5), (1, "F", 2): (3.5, 4.5),
        (1, "B", 0): (4.5, 6.5), (1, "B", 1): (6.5, 8.5), (1, "B", 2): (8.5, 10.5),
        (0, "B", 0): (7, 9), (0, "B", 1): (9, 11), (0, "B", 2): (11, 13),
    }
    assert ops == hand


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp,v", [(1, 1), (1, 5), (2, 1), (3, 2), (4, 4), (4, 9), (8, 3)])
def test_uniform_closed_form(schedule, pp, v):
    # equal micro-batches, no transfer: (PP - 1 + V) * (f + b), the planner's estimate
    res = run_pipeline(np.full((pp, v), 0.25), np.full((pp, v), 0.5), np.zeros((pp - 1, v)), np.zeros(pp), schedule)
    assert res[4].max() == pytest.approx((pp - 1 + v) * 0.75)
    # every stage runs every forward and backward once, stage by stage without overlap
    for s in range(pp):
        m = res[0] == s
        assert sorted(zip(res[2][m].tolist(), res[1][m].tolist())) == sorted(
            [(FWD, i) for i in range(v)] + [(BWD, i) for i in range(v)])
        a, e = res[3][m], res[4][m]
        order = np.argsort(a)
        assert np.all(a[order][1:] >= e[order][:-1] - 1e-12)


def test_1f1b_order_and_in_flight_limit():
    for pp in (1, 2, 4):
        for v in (1, 3, 7):
            for s in range(pp):
                order = stage_order(pp, v, s, "1f1b")
                inflight = np.cumsum([1 if k == FWD else -1 for k, _ in order])
                assert inflight.max() <= min(pp - s, v)  # 1F1B keeps at most PP - s activations


def _plan(lengths, pipes):
    return StepPlan(tuple(range(len(lengths))), tuple(lengths), 0, tuple(pipes), (), 0.0, 0.0)


def test_simulate_accounting_and_determinism():
    cm = AnalyticCostModel(get_model("llama2-7b"), get_cluster("a800x16"))
    sim = Simulator(cm)
    lengths = [4000, 300, 12000, 800, 2500, 6000, 100, 9000]
    pipes = [PipelinePlan(2, 2, 1, tuple(range(4)), 32768, ((0, 1), (2,), (3, 4)), 0.0),
             PipelinePlan(1, 1, 4, tuple(range(4, 8)), 32768, ((5, 6), (7,)), 0.0, ("per-doc", "per-seq")),
             PipelinePlan(8, 1, 1, tuple(range(8, 16)), 32768, (), 0.0)]
    r1, r2 = sim.simulate(_plan(lengths, pipes)), sim.simulate(_plan(lengths, pipes))
    assert r1.step_time == r2.step_time and np.array_equal(r1.busy, r2.busy)
    assert r1.step_time > r1.compute_time > 0
    assert r1.busy[8:].sum() == 0  # the idle pipeline
    # busy time of a device = the lengths of its intervals; busy + idle = the step
    for d in (0, 2, 5, 12):
        assert r1.busy[d] == pytest.approx(sum(e - s for s, e, _ in r1.device_intervals(d)))
        idle = sum(e - s for s, e in r1.idle_intervals(d))
        assert r1.busy[d] + idle == pytest.approx(r1.step_time)
    # without sync and optimizer the step is the last backward
    r3 = sim.simulate(_plan(lengths, pipes), pull=False, push=False, optimizer=False)
    assert r3.step_time == pytest.approx(r3.compute_time)
    # forward : backward = 1 : 2
    st, kind = r3.traces[0].stage, r3.traces[0].kind
    dur = r3.traces[0].end - r3.traces[0].start
    assert dur[(st == 0) & (kind == BWD)].sum() == pytest.approx(2 * dur[(st == 0) & (kind == FWD)].sum())


def test_stage_coeffs_recover_cost_model():
    cm = AnalyticCostModel(get_model("llama2-13b"), get_cluster("a800x64"))
    sim = Simulator(cm)
    dev = cm.cluster.device_type(0)
    for tp, cp in ((1, 1), (4, 2), (8, 1)):
        full = cm.coeffs(ParallelScheme(tp, 1, cp), dev)
        got = sim.stage_coeffs(tp, cp, cm.model.layers, True, dev)
        assert (got.a, got.b, got.c) == pytest.approx((full.a, full.b, full.c), rel=1e-9)
        # two stages of half the layers: the first without the LM head is cheaper than the last
        first, last = (sim.stage_coeffs(tp, cp, 20, s, dev) for s in (False, True))
        assert first.a == pytest.approx(last.a) and first.b < last.b


def test_overlap_hides_sync():
    cm = AnalyticCostModel(get_model("llama2-7b"), get_cluster("a800x16"))
    lengths = [16000] * 8
    pipes = [PipelinePlan(2, 4, 1, tuple(range(8)), 32768, tuple((i,) for i in range(8)), 0.0)]
    on = Simulator(cm, SimConfig(overlap_sync=True)).simulate(_plan(lengths, pipes))
    off = Simulator(cm, SimConfig(overlap_sync=False)).simulate(_plan(lengths, pipes))
    assert on.step_time < off.step_time
    assert on.compute_time <= off.compute_time
