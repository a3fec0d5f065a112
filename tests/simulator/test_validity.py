"""Simulator validity path: a fitted model's profiled schemes reach the simulator's stage times, and the simulated
busy time of a plan is the quantity `tidal train` rows measure (`runtime.calibration`: Σ_j T_j per pipeline)."""

from types import MappingProxyType

import pytest

from tidal.core.cluster import get_cluster
from tidal.core.errors import TidalError
from tidal.core.model import get_model
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.fitted import FittedCostModel, SchemeFit
from tidal.runtime.calibration import calibration_fields
from tidal.simulator.engine import SimConfig, Simulator
from tidal.simulator.validity import check_row_matches, error_stats, simulate_compute

pytestmark = pytest.mark.unit

LENGTHS = (700, 300, 24, 512, 512, 1000, 64, 64, 64, 9)


def _fitted():
    spec, cluster = get_model("tiny"), get_cluster("cpux4")
    # deliberately far from the analytic model's balance (a x 40, b x 3, c x 200 of a 50 GFLOP/s CPU), and
    # different per scheme, so the analytic fallback the simulator saw before could not match; with a per-document
    # term d (which the analytic model lacks), charged per document of every micro-batch
    fits = {"tp1pp1cp1": SchemeFit(LatencyCoeffs(3.1e-7, 6.0e-5, 0.013, 7e-4), 25, 0.05),
            "tp1pp2cp1": SchemeFit(LatencyCoeffs(1.4e-7, 3.3e-5, 0.009, 4e-4), 25, 0.05)}
    return FittedCostModel(spec, cluster, MappingProxyType(fits), AnalyticCostModel(spec, cluster))


def _step(pipes):
    return StepPlan(seq_ids=tuple(range(len(LENGTHS))), seq_lengths=LENGTHS, strategy=0, pipelines=tuple(pipes),
                    deferred=(), est_step_time=0.0, lower_bound=0.0)


def _pipe(pp, devices, mbs):
    return PipelinePlan(tp=1, pp=pp, cp=1, devices=devices, max_len=4096, micro_batches=mbs, est_time=0.0)


def test_pp1_busy_is_the_cost_models_sum_of_micro_batch_times():
    cm = _fitted()
    mbs = ((0, 1), (2, 3, 4), (5,))
    step = _step([_pipe(1, (0,), mbs), _pipe(1, (1,), ((6, 7, 8, 9),))])
    s = simulate_compute(Simulator(cm), step)
    fit = cm.coeffs(ParallelScheme(1, 1, 1), cm.cluster.device_type(0))
    want = sum(fit.mb_time([LENGTHS[i] for i in mb]) for mb in mbs)
    assert s.busy_s == pytest.approx(want, rel=1e-12)
    assert s.makespan_s == pytest.approx(want, rel=1e-12)  # one stage: no bubble, no P2P, no pull
    # the same figure `tidal train` rows predict for measured_s (max over pipelines of Σ_j T_j)
    rows = calibration_fields(step, cm, [1.0] * 4, "test")
    assert s.busy_s == pytest.approx(rows["predicted_s"], rel=1e-12)
    assert s.pipelines_busy_s == pytest.approx([q["predicted_s"] for q in rows["pipelines"]], rel=1e-12)


def test_pp2_slowest_stage_is_the_fit_and_bubbles_only_in_makespan():
    cm = _fitted()
    mbs = ((0, 1), (3, 4), (5,), (2, 6, 7, 8, 9))
    step = _step([_pipe(2, (0, 1), mbs)])
    for schedule in ("1f1b", "gpipe"):
        s = simulate_compute(Simulator(cm, SimConfig(schedule=schedule)), step)
        rows = calibration_fields(step, cm, [1.0] * 4, "test")
        assert s.busy_s == pytest.approx(rows["predicted_s"], rel=1e-12)
        assert s.makespan_s > s.busy_s * 1.1  # warm-up and drain of the other stage are waiting
        assert s.stage_ranks == (((0,), (1,)),) and max(s.stages_busy_s[0]) == s.pipelines_busy_s[0]
        assert s.stages_busy_s[0][0] < s.stages_busy_s[0][1]  # the last stage also runs the LM head


def test_unprofiled_scheme_keeps_the_fallback_and_analytic_is_unchanged():
    cm = _fitted()
    tp2 = PipelinePlan(tp=2, pp=1, cp=1, devices=(0, 1), max_len=4096, micro_batches=((0,),), est_time=0.0)
    assert Simulator(cm).fit_scale(tp2) is None
    ana = AnalyticCostModel(cm.model, cm.cluster)
    assert Simulator(ana).fit_scale(_pipe(1, (0,), ((0,),))) is None
    step = _step([_pipe(1, (0,), ((0, 1), (5,)))])
    k = ana.coeffs(ParallelScheme(1, 1, 1), ana.cluster.device_type(0))
    assert simulate_compute(Simulator(ana), step).busy_s == pytest.approx(
        k.mb_time([700, 300]) + k.mb_time([1000]), rel=1e-12)


def test_row_must_match_the_replanned_step():
    step = _step([_pipe(1, (0,), ((0, 1),)), _pipe(1, (1,), ()), _pipe(1, (2,), ((5,),))])
    row = {"pipelines": [{"micro_batches": 1, "sum_len": 1000, "sum_sq": 700 ** 2 + 300 ** 2},
                         {"micro_batches": 1, "sum_len": 1000, "sum_sq": 1000 ** 2}]}
    check_row_matches(row, step)
    row["pipelines"][1]["sum_len"] = 999
    with pytest.raises(TidalError, match="differs"):
        check_row_matches(row, step)


def test_error_stats():
    s = error_stats([(1.1, 1.0), (0.8, 1.0), (2.0, 2.0), (5.0, 0.0)])
    assert s["n"] == 3 and s["median"] == pytest.approx(0.1) and s["worst"] == pytest.approx(0.2)
    assert s["bias"] == pytest.approx(0.0)
