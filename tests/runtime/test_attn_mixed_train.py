"""attn_backend "mixed" in a training run on 2 gloo ranks (decision 119): the metrics rows count, per step, the
micro-batches each backend ran on every rank's stage, and training stays exact against one process (float64,
`tidal verify`'s tolerances: parameters and Adam moments rtol 1e-10, losses 1e-12). On CPU with gradients the
rule's flex picks run sdpa (no FlexAttention backward here): the count says so; the GPU path is in
tests/runtime/test_cuda.py."""

import pytest

from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.train import prepare

from _train_cases import jobs_worker  # isort: skip

pytestmark = pytest.mark.distributed
TOL = VERIFY_TOL["float64"]


def test_mixed_backend_counts_its_picks_and_trains_exactly():
    cfg = TrainConfig(
        model=ModelConfig("tiny", "mixed"), world=WorldConfig("cpux2"),
        data=DataConfig("stdlib:defs", 128, 512, "split", 0),
        planner=PlannerConfig("tp1pp2;2*tp1", "hydraulis", "adaptive", rotate=True),
        optimizer=OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=2),
        train=TrainSection(2, 0, "1f1b", "float64", "float64", "", False, plan_ahead=0))
    job = prepare(cfg, 2)
    (rec,) = run_distributed(jobs_worker, 2, [job], timeout_s=300)[0]
    assert len({r["strategy"] for r in rec.rows}) == 2
    for r in rec.rows:
        assert r["attn_backend"] == "mixed (mixed; flex picks run sdpa: no FlexAttention backward on CPU)"
        # every rank of a pipeline counts each of its micro-batches once (tp1pp2: both stages; 2*tp1: one rank)
        ran = sum(p["micro_batches"] * len(p["ranks"]) for p in r["pipelines"])
        assert ran > 0 and r["attn_picks"] == {"sdpa": ran, "flex": 0}, r
    losses, ref = replay_reference(job, rec.rows)
    rep = verify_report(rec.rows, losses, rec.state, ref)
    assert rep["loss"] <= TOL["loss"] and rep["params"] <= TOL["params"] and rep["moments"] <= TOL["moments"], rep
