"""Activation recomputation and offload in the executor (decision 90) on 8 gloo ranks: per-stage modes under PP, TP
with sequence parallelism, CP and tied embeddings, strategies switched every step, against one process (the
model-level equality with the run without recomputation is tests/models/test_recompute.py's, at rtol 1e-12).

Tolerance (float64, as `tidal verify`): parameters and Adam moments within rtol 1e-10, losses within 1e-12 of one
process (tests/runtime/test_executor.py says why)."""

import dataclasses

import pytest

from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.train import prepare

from _train_cases import jobs_worker  # isort: skip

pytestmark = pytest.mark.distributed
TOL = VERIFY_TOL["float64"]
STRATEGIES = "tp2cp2+tp2pp2;tp1pp4+tp1pp2+2*tp1"


def _config(recompute: str, offload: bool) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig("tiny-tied", "sdpa"), world=WorldConfig("cpux8"),
        data=DataConfig("stdlib:defs", 192, 768, "split", 0),
        planner=PlannerConfig(STRATEGIES, "hydraulis", "adaptive", rotate=True),
        optimizer=OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=2),
        train=TrainSection(2, 0, "1f1b", "float64", "float64", "", False, sequence_parallel=True,
                           recompute=recompute, offload=offload))


@pytest.fixture(scope="module")
def runs():
    jobs = [prepare(_config("full,selective,none,full", True), 8)]
    results = run_distributed(jobs_worker, 8, jobs, timeout_s=600)[0]
    return jobs, results


def test_recompute_and_offload_match_single_process(runs):
    jobs, (rec,) = runs
    assert jobs[0].exec_config.recompute == ("full", "selective", "none", "full") and jobs[0].exec_config.offload
    assert len({r["strategy"] for r in rec.rows}) == 2
    modes = ["full", "selective", "none", "full"]
    by_name = {str(c): c for c in jobs[0].candidates}
    for r in rec.rows:  # the metrics rows name each pipeline's per-stage modes
        assert r["recompute"] == [modes[:p.scheme.pp] for p in by_name[r["strategy"]].pipelines], r
    losses, ref = replay_reference(jobs[0], rec.rows)
    rep = verify_report(rec.rows, losses, rec.state, ref)
    assert rep["loss"] <= TOL["loss"] and rep["params"] <= TOL["params"] and rep["moments"] <= TOL["moments"], rep


def test_recompute_config_is_checked():
    from tidal.core.errors import TidalError

    with pytest.raises(TidalError, match=r"\[train\] recompute mode must be one of"):
        dataclasses.replace(TrainSection(), recompute="full,most")
