"""`[model] compile = "dense"` in a training run on 2 gloo ranks (decision 140): with TP2 (its collectives around the
compiled FeedForward gate), a two-stage pipeline and data parallelism across strategy switches, training with each
rank's RMSNorm and SwiGLU gate compiled by Inductor stays exact against one eager process (float64, `tidal verify`'s
tolerances: parameters and Adam moments rtol 1e-10, losses 1e-12), and the executor's stages run compiled."""

import pytest

from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.train import prepare

from _train_cases import jobs_worker  # isort: skip

pytestmark = pytest.mark.distributed
TOL = VERIFY_TOL["float64"]


def test_dense_compile_trains_exactly_on_tp_pp_and_dp():
    cfg = TrainConfig(
        model=ModelConfig("tiny", "sdpa", compile="dense"), world=WorldConfig("cpux2"),
        data=DataConfig("stdlib:defs", 128, 512, "split", 0),
        planner=PlannerConfig("tp2;tp1pp2;2*tp1", "hydraulis", "adaptive", rotate=True),
        optimizer=OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=2),
        train=TrainSection(3, 0, "1f1b", "float64", "float64", "", False, plan_ahead=0))
    job = prepare(cfg, 2)
    assert job.exec_config.compile == "dense"
    (rec,) = run_distributed(jobs_worker, 2, [job], timeout_s=300)[0]
    assert len({r["strategy"] for r in rec.rows}) == 3 and all(r["compile"] == "dense" for r in rec.rows)
    losses, ref = replay_reference(job, rec.rows)
    rep = verify_report(rec.rows, losses, rec.state, ref)
    assert rep["loss"] <= TOL["loss"] and rep["params"] <= TOL["params"] and rep["moments"] <= TOL["moments"], rep
