"""Checkpoint directories (runtime/ckptdir.py, runtime/checkpoint.py): damaged checkpoints are detected, named and
skipped for the previous complete one; keep-the-last-K; asynchronous saves; metrics cut back on resume; a finished
run is refused; `tidal checkpoint inspect`; the planner's stream carried across candidate lists.

The checkpoints are written by a one-rank gloo group in this process (no spawned ranks). Tolerance: exact.
"""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tidal.core import TidalError, get_cluster, get_model
from tidal.core.model import param_table
from tidal.runtime import checkpoint as ckpt
from tidal.runtime import ckptdir

pytestmark = [pytest.mark.reliability, pytest.mark.unit]

EMB = "tok_embeddings.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """<d>/step-000002, -000004, -000006, saved asynchronously with keep_checkpoints = 2; the master weights of
    each (rank 0 holds every row in a world of one)."""
    from tidal.costmodel import AnalyticCostModel
    from tidal.planner.stepper import build_candidates
    from tidal.runtime.executor import ExecConfig, Executor
    from tidal.runtime.groups import GroupCache
    from tidal.runtime.optim import OptimConfig

    root = tmp_path_factory.mktemp("ckdir")
    dist.init_process_group("gloo", store=dist.FileStore(str(root / "store"), 1), rank=0, world_size=1)
    try:
        spec, cluster = get_model("tiny"), get_cluster("cpux1")
        cands = build_candidates(AnalyticCostModel(spec, cluster), "tp1", None, tokens_per_step=256, max_len=128,
                                 seed=0)
        ex = Executor(spec, cluster, cands, ExecConfig(master_dtype="float64"), OptimConfig(), GroupCache())
        saver = ckptdir.Saver(str(root / "d"), keep=2, use_async=True, config={"train": {"steps": 6}})
        weights = {}
        for step in (2, 4, 6):
            with torch.no_grad():
                for t in ex.optim.params + ex.optim.m + ex.optim.v:
                    t.add_(step)
            ex.optim.steps = step
            saver.save(ex, step, {"planner": {"index": step, "candidates": ["tp1"]}})
            weights[step] = ex.optim.params[0].clone()
            with torch.no_grad():  # changed while the save is in flight: the staged copy must not see it
                ex.optim.params[0].add_(1000.0)
            saver.step_done(step + 1)
            with torch.no_grad():
                ex.optim.params[0].sub_(1000.0)
        saver.close()
    finally:
        dist.destroy_process_group()
    return root / "d", weights


def _emb(path) -> torch.Tensor:
    return ckpt.read_slice(path, "params", 0, dtype=torch.float64)


def test_async_saves_keep_the_last_two_and_hold_the_staged_values(saved):
    d, weights = saved
    assert [p.name for _, p in ckptdir.checkpoints(d)] == ["step-000006", "step-000004"]
    assert (d / "latest").read_text().strip() == "step-000006"
    for step in (4, 6):
        meta = ckpt.verify(d / f"step-{step:06d}", get_model("tiny"))
        assert meta["step"] == step and meta["optimizer_steps"] == step and meta["world"] == 1
        assert torch.equal(_emb(d / f"step-{step:06d}"), weights[step])


def _damage(path, how: str) -> str:
    """Damage checkpoint `path`; returns the text the one-line note must contain."""
    data = path / "__0_0.distcp"
    if how == "truncated":
        data.write_bytes(data.read_bytes()[:-100])
        return "__0_0.distcp: truncated"
    if how == "missing":
        data.unlink()
        return "__0_0.distcp: missing"
    if how == "corrupted":  # flip the bytes of one value in the middle of the file
        b = bytearray(data.read_bytes())
        b[len(b) // 2: len(b) // 2 + 4] = bytes(x ^ 0xFF for x in b[len(b) // 2: len(b) // 2 + 4])
        data.write_bytes(bytes(b))
        return "__0_0.distcp: corrupted"
    if how == "half-written":  # interrupted before the manifest (a save's last write)
        (path / ckpt.MANIFEST).unlink()
        return "no manifest.json: half-written"
    if how == "metadata":
        (path / ".metadata").write_bytes(b"")
        return ".metadata: truncated"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "missing", "corrupted", "half-written", "metadata"])
def test_damaged_latest_is_named_and_the_previous_complete_one_used(saved, tmp_path, how):
    d, weights = saved
    shutil.copytree(d, tmp_path / "d")
    want = _damage(tmp_path / "d" / "step-000006", how)
    res = ckptdir.resolve(tmp_path / "d", get_model("tiny"))
    assert res.path.endswith("step-000004") and res.meta["step"] == 4
    assert want in res.note and "using step-000004" in res.note and "\n" not in res.note
    assert torch.equal(_emb(res.path), weights[4])


def test_a_bad_latest_pointer_falls_back_and_nothing_usable_is_one_line(saved, tmp_path):
    d, _ = saved
    shutil.copytree(d, tmp_path / "d")
    (tmp_path / "d" / "latest").write_text("../../etc\n")
    res = ckptdir.resolve(tmp_path / "d", get_model("tiny"))
    assert res.path.endswith("step-000006") and "not a checkpoint here" in res.note
    _damage(tmp_path / "d" / "step-000006", "corrupted")
    _damage(tmp_path / "d" / "step-000004", "missing")
    with pytest.raises(TidalError, match=r"no complete, verified checkpoint .*step-000004/__0_0.distcp: missing"):
        ckptdir.resolve(tmp_path / "d", get_model("tiny"))
    with pytest.raises(TidalError, match="does not match model"):
        ckptdir.resolve(d, get_model("small"))


def _cfg(steps: int, d, metrics=""):
    import dataclasses

    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    return TrainConfig(model=ModelConfig("tiny", "sdpa"), world=WorldConfig("cpux1"),
                       data=DataConfig("stdlib:defs", 128, 256, "split", 0), planner=PlannerConfig("tp1"),
                       train=dataclasses.replace(TrainSection(steps, 0, master_dtype="float64"),
                                                 checkpoint_dir=str(d), resume=True, metrics=metrics))


def test_resume_of_a_finished_run_says_so(saved):
    from tidal.runtime.train import prepare

    d, _ = saved
    with pytest.raises(TidalError, match=r"step-000006 is at step 6 >= \[train\] steps 6: nothing left to train"):
        prepare(_cfg(6, d), 1)
    assert prepare(_cfg(8, d), 1).resume_from.endswith("step-000006")


def test_metrics_rows_after_the_checkpoint_are_dropped(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(7)) + '{"step": 7, "lo')
    assert ckptdir.truncate_metrics(m, 4) == 4  # steps 4, 5, 6 and the torn row
    assert [json.loads(x)["step"] for x in m.read_text().splitlines()] == [0, 1, 2, 3]


def test_inspect_prints_step_config_and_tensor_shapes(saved, capsys):
    from tidal.cli.main import main

    d, _ = saved
    assert main(["checkpoint", "inspect", str(d)]) == 0
    out = capsys.readouterr().out
    assert "step 6  optimizer steps 6  written by 1 ranks" in out and "[train] steps = 6" in out
    spec = get_model("tiny")
    for info in param_table(spec):
        shape = "x".join(map(str, info.shape))
        for key in (f"model.{info.name}", f"optim.exp_avg.{info.name}", f"optim.exp_avg_sq.{info.name}"):
            assert any(line.split()[:2] == [key, shape] for line in out.splitlines()), key
    assert main(["checkpoint", "inspect", str(d / "nope")]) == 2


def test_planner_stream_carries_over_candidate_changes_exactly_once(tmp_path):
    """A WLB stream over a finite corpus, its candidate list changed at three checkpoints (4 -> 3 -> 4 devices
    among them): every document is trained exactly once over the epoch; the note is one line; a changed max_len
    is refused in one line."""
    from tidal.baselines.packings import PACKINGS
    from tidal.costmodel import AnalyticCostModel
    from tidal.data import EpochLedger, TokenBudgetSampler, corpus_from_spec
    from tidal.planner.stepper import PlanningOptions, StepPlanner, build_candidates, carry_state

    rng = np.random.default_rng(3)  # 80 documents of 20-900 bytes: ~35 steps, some split at max_len
    docs = ["".join(chr(97 + x) for x in rng.integers(0, 26, n)) for n in rng.integers(20, 900, 80)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    corpus = corpus_from_spec(f"jsonl:{src}", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    opts = PlanningOptions(max_len=192, tokens_per_step=768, packing="wlb", seed=0)

    def planner(strategies: str, world: int, state=None):
        cm = AnalyticCostModel(get_model("tiny"), get_cluster(f"cpux{world}"))
        cands = build_candidates(cm, strategies, None, tokens_per_step=768, max_len=192, seed=0)
        p = StepPlanner(cm, cands, TokenBudgetSampler(corpus.length_source(), 768, 192, seed=0), opts,
                        packings=PACKINGS)
        note = ""
        if state is not None:
            state, note = carry_state(json.loads(json.dumps(state)), opts, cands)
            p.load_state_dict(state)
        return p, note

    ledger = EpochLedger(corpus.length_source().lengths(0, len(corpus)), f"jsonl:{src}")
    p, _ = planner("4*tp1", 4)
    notes, queued, k = [], 0, 0
    for strategies, world in (("tp2+tp1", 3), ("tp1cp2+tp2;2*tp1pp2", 4), ("4*tp1", 4)):
        for _ in range(6):
            ledger.record_planned(p.next())
            k += 1
        queued += len(p.state_dict()["in_flight"])
        p, note = planner(strategies, world, p.state_dict())
        notes.append(note)
    while (ps := p.next()) is not None:
        ledger.record_planned(ps)
    ledger.check_complete()  # every document of the epoch trained exactly once
    assert queued > 0  # some interruption had WLB-delayed sequences in flight
    assert all(n.startswith("resume: planner rebuilt for candidates") and "\n" not in n for n in notes)
    other = PlanningOptions(max_len=256, tokens_per_step=768, packing="wlb", seed=0)
    with pytest.raises(TidalError, match=r"cannot continue exactly once .*max_len 192 -> 256"):
        carry_state(p.state_dict(), other, p.candidates)
    assert carry_state(p.state_dict(), opts, p.candidates) == (p.state_dict(), "")
