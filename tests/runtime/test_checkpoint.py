"""Sharded checkpoints (runtime/checkpoint.py): saved by 4 ranks, loaded by 2, and a TP stage built from one.

Tolerance: exact. Every value is stored as the fp32 it was and read back unchanged, whatever world size reads it.
"""

import json

import numpy as np
import pytest
import torch

from tidal.core import TidalError, get_model
from tidal.core.model import param_table
from tidal.runtime import checkpoint as ckpt
from tidal.runtime.launch import run_distributed

from _ckpt_cases import executor_load_worker, executor_save_worker, resume_worker  # isort: skip

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "step3")
    state = run_distributed(executor_save_worker, 4, path, 0, timeout_s=300)[0]
    loaded = run_distributed(executor_load_worker, 2, path, timeout_s=300)
    return path, state, loaded


def test_world4_checkpoint_loads_exactly_on_world2(saved):
    path, state, loaded = saved
    for kind in ("params", "m", "v"):
        for name, want in state[kind].items():
            got = loaded[0]["state"][kind][name]
            assert np.array_equal(got, want), (kind, name)
    assert all(r["steps"] == 7 for r in loaded)
    meta = loaded[0]["meta"]
    assert meta["step"] == 3 and meta["world"] == 4 and meta["state"] == {"planner": {"index": 3}}


def test_stage_built_from_checkpoint_is_the_tp_slice(saved):
    """build_stage_model(checkpoint=...) reads each TP shard through the same per-slice path as initialisation."""
    path, state, loaded = saved
    spec = get_model("tiny")
    dims = {i.name: i.tp_dim for i in param_table(spec)}
    for r in loaded:
        for name, got in r["stage"].items():
            full = state["params"][name]
            d = dims[name]
            want = full if d is None else np.split(full, 2, axis=d)[r["tp_rank"]]
            assert np.array_equal(got, want), name


def test_incomplete_or_foreign_checkpoints_are_refused(saved, tmp_path):
    path, _, _ = saved
    with pytest.raises(TidalError, match="no manifest.json"):
        ckpt.load_meta(tmp_path)
    with pytest.raises(TidalError, match="does not match model"):
        ckpt.load_meta(path, get_model("small"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"format": "other/1"}))
    with pytest.raises(TidalError, match="format"):
        ckpt.load_meta(bad)


def test_read_slice_reads_rows_and_columns(saved):
    """One process reads any block of a logical tensor (DCP no_dist), across the chunks 4 ranks wrote."""
    path, state, _ = saved
    spec = get_model("tiny")
    i = next(j for j, x in enumerate(param_table(spec)) if x.name == "layers.0.attention.wq.weight")
    full = state["params"]["layers.0.attention.wq.weight"]
    got = ckpt.read_slice(path, "params", i, (2, 37), (3, 7), dtype=torch.float64)
    assert np.array_equal(got.numpy(), full[2:37, 3:7])
    assert np.array_equal(ckpt.read_slice(path, "v", i, dtype=torch.float64).numpy(),
                          state["v"]["layers.0.attention.wq.weight"])


def _config(steps: int, ckpt_dir: str = "", every: int = 0, resume: bool = False):
    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.optim import OptimConfig
    cfg = TrainConfig(
        model=ModelConfig("tiny", "sdpa"), world=WorldConfig("cpux4"),
        data=DataConfig("stdlib:defs", 192, 768, "split", 0),
        planner=PlannerConfig("tp2+2*tp1;tp1cp2+tp2;4*tp1", "wlb", "adaptive", rotate=True),
        optimizer=OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=6),
        train=TrainSection(steps, 0, "1f1b", "float64", "float64", "", False, checkpoint_dir=ckpt_dir,
                           checkpoint_every=every, resume=resume))
    return cfg


def test_interrupted_and_resumed_training_equals_uninterrupted(tmp_path):
    """6 steps straight vs 2 + 2 + 2 with a checkpoint and a resume in between (planner ahead in its process, WLB
    queues, strategies rotating): the same documents every step and bit-identical weights and moments."""
    d = str(tmp_path / "ckpt")
    configs = [_config(6), _config(2, d), _config(4, d, every=2, resume=True), _config(6, d, resume=True)]
    full, first, second, third = run_distributed(resume_worker, 4, configs, timeout_s=900)[0]
    pieces = first.rows + second.rows + third.rows
    assert [r["step"] for r in pieces] == [r["step"] for r in full.rows]
    assert [r["docs_run"] for r in pieces] == [r["docs_run"] for r in full.rows]
    assert [r["strategy"] for r in pieces] == [r["strategy"] for r in full.rows]
    for kind in ("params", "m", "v"):
        for name, want in full.state[kind].items():
            assert np.array_equal(third.state[kind][name], want), (kind, name)
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step-000006"
    assert third.rows[-1]["data"] == full.rows[-1]["data"]  # exactly-once counters carried across resumes


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    from tidal.runtime.train import prepare

    with pytest.raises(TidalError, match="no checkpoint"):
        prepare(_config(4, str(tmp_path), resume=True), 4)
    with pytest.raises(TidalError, match="need checkpoint_dir"):
        prepare(_config(4, "", resume=True), 4)


def test_resume_plans_with_the_online_refit_in_force(tmp_path):
    """[train] refit = online: a run resumed from a checkpoint predicts its first step with the refitted coefficients
    of the run that wrote it (label refit-1 and the same prediction as that refit's model), not with the file's."""
    import dataclasses

    from tidal.runtime.calibration import OnlineRefit, repredict

    d = str(tmp_path / "ckpt")

    def cfg(steps: int, resume: bool):
        from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
        from tidal.runtime.optim import OptimConfig
        return TrainConfig(
            model=ModelConfig("tiny", "sdpa"), world=WorldConfig("cpux2"),
            data=DataConfig("stdlib:defs", 192, 768, "split", 0), planner=PlannerConfig("2*tp1", "hydraulis"),
            optimizer=OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=6),
            train=dataclasses.replace(TrainSection(steps, 0, progress=False, refit="online", refit_every=2,
                                                   plan_ahead=1), checkpoint_dir=d, resume=resume))
    first, second = run_distributed(resume_worker, 2, [cfg(4, False), cfg(6, True)], timeout_s=600)[0]
    assert [r["step"] for r in second.rows] == [4, 5]
    assert [r["cost_model"] for r in first.rows] == ["analytic"] * 4  # 2 pipelines a step: 6 rows by step 3
    assert second.rows[0]["cost_model"] == "refit-1"
    from tidal.runtime.train import prepare
    refit = OnlineRefit(prepare(cfg(4, False), 2).cost_model(), every=2)
    for r in first.rows:
        refit.observe(r)
    assert refit.current is not None
    want = repredict([second.rows[0]], refit.current)[0]
    assert second.rows[0]["predicted_s"] == pytest.approx(want["predicted_s"], rel=1e-12)
    assert second.rows[0]["predicted_s"] != pytest.approx(repredict([second.rows[0]], refit.base)[0]["predicted_s"])
