"""Worker bodies for tests/runtime/test_checkpoint.py (spawned gloo ranks)."""

from __future__ import annotations

import torch

from tidal.core import ParallelScheme, get_cluster, get_model
from tidal.core.strategy import Pipeline
from tidal.costmodel import AnalyticCostModel
from tidal.planner.stepper import build_candidates
from tidal.runtime.executor import ExecConfig, Executor
from tidal.runtime.groups import GroupCache
from tidal.runtime.optim import OptimConfig
from tidal.runtime.pipeline import RankGrid, build_stage_model


def executor_save_worker(rank: int, world: int, path: str, seed: int) -> dict | None:
    """An executor whose optimizer state is made non-trivial, saved at world `world`."""
    spec = get_model("tiny")
    ex = _executor(spec, world, seed)
    g = torch.Generator().manual_seed(100 + rank)
    with torch.no_grad():
        for t in ex.optim.params + ex.optim.m + ex.optim.v:
            t.add_(torch.randn(t.shape, generator=g, dtype=t.dtype))
    ex.optim.steps = 7
    ex.save_checkpoint(path, step=3, state={"planner": {"index": 3}})
    return ex.gather_state()


def executor_load_worker(rank: int, world: int, path: str) -> dict:
    """Load at another world size; also build a tp2 stage straight from the checkpoint."""
    spec = get_model("tiny")
    ex = _executor(spec, world, seed=99)  # a different initialisation: everything must come from the file
    meta = ex.load_checkpoint(path)
    state = ex.gather_state()
    pipe = Pipeline(ParallelScheme(tp=2), (0, 1))
    out = {"meta": meta, "state": state, "steps": ex.optim.steps}
    if rank < 2:
        grid = RankGrid.build(pipe, rank, GroupCache().create_all([pipe]))
        model = build_stage_model(spec, grid, checkpoint=path)
        out["stage"] = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        out["tp_rank"] = grid.tp_rank
    return out


def _executor(spec, world: int, seed: int) -> Executor:
    cluster = get_cluster(f"cpux{world}")
    cm = AnalyticCostModel(spec, cluster)
    cands = build_candidates(cm, f"{world}*tp1", None, tokens_per_step=256, max_len=128, seed=0)
    return Executor(spec, cluster, cands, ExecConfig(seed=seed), OptimConfig(), GroupCache())


def resume_worker(rank: int, world: int, configs: list) -> list:
    """Run each config in turn (an uninterrupted run, then a run that stops and runs that resume it); each is prepared
    here, after the previous run wrote the checkpoint it resumes from."""
    from tidal.runtime.train import prepare, train_worker

    out = []
    for cfg in configs:
        res = train_worker(rank, world, prepare(cfg, world), record=True)
        out.append(res if rank == 0 else None)
    return out
