"""Calibration: predicted vs measured fields of a step, `tidal report calibration` on a metrics file with known errors,
its bad-input messages, and swapping the planner's cost model (online refit)."""

import json

import numpy as np
import pytest

from tidal.cli.main import main
from tidal.core import TidalError, get_cluster, get_model
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import parse_strategy
from tidal.core.strategy import place
from tidal.costmodel import AnalyticCostModel
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.planner.stepper import PlanningOptions, StepPlanner
from tidal.runtime.calibration import OnlineRefit, calibration_fields, calibration_stats, read_metrics, repredict

TINY, CPU4 = get_model("tiny"), get_cluster("cpux4")


def _step() -> StepPlan:
    pipes = (PipelinePlan(2, 1, 1, (0, 1), 4096, ((0, 1), (2,)), 0.0),
             PipelinePlan(1, 1, 1, (2,), 4096, ((3,),), 0.0),
             PipelinePlan(1, 1, 1, (3,), 4096, (), 0.0))  # an idle pipeline is not a calibration point
    return StepPlan((0, 1, 2, 3), (100, 300, 500, 700), 0, pipes, (), 0.0, 0.0)


def test_calibration_fields_sum_micro_batches_and_take_the_slowest_rank():
    cm = AnalyticCostModel(TINY, CPU4)
    dev = CPU4.device_type(0)
    f = calibration_fields(_step(), cm, [0.5, 0.7, 0.2, 0.0], "analytic")
    p0, p1 = f["pipelines"]
    k2 = cm.coeffs(place(parse_strategy("tp2+2*tp1"), CPU4, TINY).pipelines[0].scheme, dev)
    assert p0["predicted_s"] == pytest.approx(k2.mb_time([100, 300]) + k2.mb_time([500]))
    assert (p0["measured_s"], p1["measured_s"]) == (0.7, 0.2)
    assert (p0["sum_len"], p0["sum_sq"], p0["micro_batches"]) == (900, 100**2 + 300**2 + 500**2, 2)
    assert f["measured_s"] == 0.7 and f["predicted_s"] == max(p0["predicted_s"], p1["predicted_s"])
    # the features re-predict exactly
    again = repredict([{**f, "pipelines": [dict(p, predicted_s=0.0) for p in f["pipelines"]]}], cm)[0]
    assert [p["predicted_s"] for p in again["pipelines"]] == pytest.approx([p0["predicted_s"], p1["predicted_s"]])


def _metrics(tmp_path, errors_step, errors_pipe):
    """Rows whose step and pipeline predictions are off by known relative errors."""
    lines = []
    for i, (es, ep) in enumerate(zip(errors_step, errors_pipe)):
        meas = 1.0 + 0.1 * i
        pipes = [{"scheme": "tp1pp1cp1", "ranks": [0], "micro_batches": 1, "sum_len": 100, "sum_sq": 10000,
                  "predicted_s": meas * (1 + ep), "measured_s": meas}]
        lines.append(json.dumps({"step": i, "predicted_s": meas * (1 + es), "measured_s": meas, "pipelines": pipes}))
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_report_calibration_prints_median_and_p90(tmp_path, capsys):
    rng = np.random.default_rng(0)
    es = rng.normal(0, 0.05, 40)
    ep = rng.normal(0.02, 0.1, 40)
    path = _metrics(tmp_path, es, ep)
    png = tmp_path / "c.png"
    assert main(["report", "calibration", str(path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split(":")[0]: ln for ln in out.splitlines() if ln.startswith("calibration per")}
    for level, e in (("step", es), ("pipeline", ep)):
        words = lines[f"calibration per {level}"].split()
        got = dict(zip(words[3::2], words[4::2]))
        assert float(got["median"]) == pytest.approx(np.median(np.abs(e)), abs=1e-4)
        assert float(got["p90"]) == pytest.approx(np.percentile(np.abs(e), 90), abs=1e-4)
    assert png.stat().st_size > 1000
    s = calibration_stats(read_metrics(path), skip=10)
    assert s["steps"] == 30 and s["step"]["median"] == pytest.approx(np.median(np.abs(es[10:])))


@pytest.mark.parametrize("content,msg", [
    (None, "cannot read metrics"),
    ('{"predicted_s": 1, "measured_s": 1, "pipelines": []}\n\n{"step": 3\n', "m.jsonl:3: malformed JSON"),
    ('{"step": 0, "loss": 1.0}\n', "m.jsonl:1: missing field 'predicted_s'"),
    ('{"predicted_s": 1, "measured_s": "x", "pipelines": []}\n', "m.jsonl:1: predicted and measured times"),
    ('{"predicted_s": 1, "measured_s": 1, "pipelines": [{"scheme": "tp1"}]}\n', "m.jsonl:1: a pipeline entry"),
    ("", "no metrics rows"),
])
def test_report_calibration_bad_input_is_one_line(tmp_path, capsys, content, msg):
    path = tmp_path / "m.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["report", "calibration", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and str(path) in err


def _planner(cm):
    cands = tuple(place(parse_strategy(s), CPU4, TINY) for s in ("4*tp1", "2*tp2", "tp4"))
    sampler = TokenBudgetSampler(length_source("synthetic:github", 0), 4096, 1024, seed=0)
    return StepPlanner(cm, cands, sampler, PlanningOptions(max_len=1024, tokens_per_step=4096))


def test_set_cost_model_plans_as_a_planner_built_with_that_model():
    from tidal.costmodel.refit import PipelineObs

    base = AnalyticCostModel(TINY, CPU4)
    obs = [PipelineObs("tp1pp1cp1", 1e6 * (i + 1), 2e3 * (i + 3), 1 + i % 3, 0.05 * (i + 2)) for i in range(8)]
    refit = OnlineRefit(base, every=1, min_rows=6)
    row = {"pipelines": [{"scheme": o.scheme, "sum_sq": o.sum_sq, "sum_len": o.sum_len,
                          "micro_batches": o.micro_batches, "measured_s": o.seconds} for o in obs]}
    new = refit.observe(row)
    assert new is not None and refit.generation == 1
    a, b = _planner(base), _planner(new)
    a.set_cost_model(new)
    for _ in range(3):
        x, y = a.next(), b.next()
        assert x.plan.to_dict(timings=False) == y.plan.to_dict(timings=False)


def test_plans_recording_the_even_layer_split_are_costed_as_the_plain_scheme():
    from types import MappingProxyType

    from tidal.costmodel.base import LatencyCoeffs
    from tidal.costmodel.fitted import FittedCostModel, SchemeFit

    k = LatencyCoeffs(1e-7, 5e-5, 0.01)
    fm = FittedCostModel(TINY, CPU4, MappingProxyType({"tp1pp1cp1": SchemeFit(k, 10, 0.0)}),
                         AnalyticCostModel(TINY, CPU4))
    step = StepPlan((0,), (300,), 0, (PipelinePlan(1, 1, 1, (0,), 4096, ((0,),), 0.0, (), (6,)),), (), 0.0, 0.0)
    (q,) = calibration_fields(step, fm, [0.1, 0, 0, 0], "p.json")["pipelines"]
    assert q["scheme"] == "tp1pp1cp1" and q["predicted_s"] == pytest.approx(k.mb_time([300]))


def test_per_document_term_is_predicted_and_re_predicted_from_the_docs_count():
    from types import MappingProxyType

    from tidal.costmodel import LatencyCoeffs
    from tidal.costmodel.fitted import FittedCostModel, SchemeFit

    k = LatencyCoeffs(2e-7, 5e-5, 0.01, 7e-4)
    cm = FittedCostModel(TINY, CPU4, MappingProxyType({"tp1pp1cp1": SchemeFit(k, 10, 0.0)}),
                         AnalyticCostModel(TINY, CPU4))
    f = calibration_fields(_step(), cm, [0.5, 0.7, 0.2, 0.0], "fitted")
    p1 = f["pipelines"][1]
    assert (p1["scheme"], p1["docs"]) == ("tp1pp1cp1", 1)
    assert p1["predicted_s"] == pytest.approx(0.01 + 2e-7 * 700**2 + 5e-5 * 700 + 7e-4)
    again = repredict([{**f, "pipelines": [dict(p, predicted_s=0.0) for p in f["pipelines"]]}], cm)[0]
    assert again["pipelines"][1]["predicted_s"] == pytest.approx(p1["predicted_s"])
    old = {**f, "pipelines": [{q: v for q, v in p.items() if q != "docs"} for p in f["pipelines"]]}
    with pytest.raises(TidalError, match="no 'docs' count"):
        repredict([old], cm)
    assert repredict([old], AnalyticCostModel(TINY, CPU4))  # a model without d needs no count


def _obs_rows(n: int) -> list[dict]:
    """n steps of two schemes' pipelines with times that follow no exact model (so refits differ step to step)."""
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(n):
        pipes = []
        for scheme in ("tp1pp1cp1", "tp2pp1cp1"):
            v, docs = int(rng.integers(1, 4)), int(rng.integers(1, 9))
            sl = float(rng.integers(200, 4000))
            sq = sl * sl / docs
            t = (2e-8 * sq + 1e-4 * sl + 0.01 * v + 0.002 * docs) * float(rng.uniform(0.8, 1.3))
            pipes.append({"scheme": scheme, "sum_sq": sq, "sum_len": sl, "micro_batches": v, "docs": docs,
                          "measured_s": t})
        rows.append({"pipelines": pipes})
    return rows


def test_online_refit_state_resumes_the_same_refits():
    """A refit restored from a JSON round trip of its state (as a checkpoint stores it) holds the model in force and
    refits later steps to exactly the models of the uninterrupted refit."""
    base, rows = AnalyticCostModel(TINY, CPU4), _obs_rows(17)
    a = OnlineRefit(base, every=3, min_rows=6, window=8)
    for r in rows[:7]:
        a.observe(r)
    assert a.current is not None and a.generation == 1
    b = OnlineRefit(base, every=3, min_rows=6, window=8)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.current is not None and b.generation == 1 and b.current.fits == a.current.fits
    for r in rows[7:]:
        x, y = a.observe(r), b.observe(r)
        assert (x is None) == (y is None)
        if x is not None:
            assert x.fits == y.fits
    assert a.generation == b.generation == 4


@pytest.mark.parametrize("state", [
    {"seen": 1},
    {"seen": 1, "generation": 0, "obs": {"tp1": [[1, 2]]}, "model": None},
    {"seen": 1, "generation": 1, "obs": {}, "model": {"tp1": {"a": -1, "b": 0, "c": 0}}}])
def test_malformed_refit_state_is_one_line(state):
    with pytest.raises(TidalError, match="online-refit state") as e:
        OnlineRefit(AnalyticCostModel(TINY, CPU4)).load_state_dict(state)
    assert "\n" not in str(e.value)
