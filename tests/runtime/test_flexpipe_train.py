"""`tidal train` / `tidal verify` with the FlexPipe planner (decision 91): the depth goes 4 -> 2 -> 1 over three
steps on 4 gloo ranks (uneven 6-layer split at PP 4), every step after the first reconfigures and pulls the layers
its ranks gain at no more than their parameter bytes, and the result equals one process at `tidal verify`'s float64
tolerances. (Deepening moves nothing on this layout: a deeper stage's layers are a subset of what its devices held.)"""

from __future__ import annotations

import pytest

from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.train import prepare

from _train_cases import jobs_worker  # isort: skip

pytestmark = pytest.mark.distributed
TOL = VERIFY_TOL["float64"]


def _config(steps: int = 3) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig("tiny", "sdpa"), world=WorldConfig("cpux4"),
        data=DataConfig("stdlib:defs", 128, 384, "split", 0),
        planner=PlannerConfig(name="flexpipe", flexpipe_depths="4,2,1"),
        optimizer=OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=steps),
        train=TrainSection(steps, 0, "1f1b", "float64", "float64", "", False))


@pytest.fixture(scope="module")
def run():
    job = prepare(_config(), 4)
    return job, run_distributed(jobs_worker, 4, [job], timeout_s=900)[0][0]


def test_flexpipe_reconfigures_every_step_and_matches_one_process(run):
    job, res = run
    depths = [job.candidates[r["strategy_index"]].pipelines[0].scheme.pp for r in res.rows]
    assert depths == [4, 2, 1], depths
    assert [r["reconfigured"] for r in res.rows] == [False, True, True]
    pp4 = job.candidates[res.rows[0]["strategy_index"]].pipelines[0].scheme
    assert sorted(pp4.layer_split) == [1, 1, 2, 2]  # 6 layers on 4 stages: uneven
    for r in res.rows[1:]:
        assert r["moved_groups"] > 0 and r["reconfig_bytes"] > 0
        assert r["reconfig_bytes"] <= 1.05 * r["moved_param_bytes"], r  # at the minimum (decision 74)
        assert r["reconfig_stall_s"] == r["pull_s"]
    losses, ref = replay_reference(job, res.rows)
    rep = verify_report(res.rows, losses, res.state, ref)
    assert rep["loss"] <= TOL["loss"] and rep["params"] <= TOL["params"] and rep["moments"] <= TOL["moments"], rep
