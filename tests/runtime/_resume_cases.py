"""Worker bodies for tests/runtime/test_resume_anywhere.py (spawned gloo ranks)."""

from __future__ import annotations

import dataclasses

import numpy as np


def config(world: int, strategies: str, steps: int, ckpt_dir: str, resume: bool):
    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.optim import OptimConfig

    return TrainConfig(
        model=ModelConfig("tiny", "sdpa"), world=WorldConfig(f"cpux{world}"),
        data=DataConfig("stdlib:defs", 192, 768, "split", 0),
        planner=PlannerConfig(strategies, "hydraulis", "adaptive"),
        optimizer=OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=8),
        train=dataclasses.replace(TrainSection(steps, 0, "1f1b", "float64", "float64", "", False), plan_ahead=0,
                                  checkpoint_dir=ckpt_dir, resume=resume))


def loaded_state(job, path: str):
    """A fresh executor of `job`'s candidates (another initialisation seed: everything must come from the file)
    loads `path`; its full state, gathered on rank 0."""
    from tidal.runtime.executor import Executor
    from tidal.runtime.groups import GroupCache

    ex = Executor(job.spec, job.cluster, job.candidates, dataclasses.replace(job.exec_config, seed=123),
                  job.config.optimizer, GroupCache())
    ex.load_checkpoint(path)
    return ex.gather_state(), ex.optim.steps


def equal_states(a: dict, b: dict) -> list[str]:
    """Names of the tensors that differ (bitwise) between two gathered states."""
    return [f"{k}:{n}" for k in ("params", "m", "v") for n in a[k] if not np.array_equal(a[k][n], b[k][n])]


def chain_worker(rank: int, world: int, segments: list, ckpt_dir: str, before: dict | None) -> dict | None:
    """Run each (strategies, steps) segment in turn, each resuming from the last one's checkpoint (the first one
    too when `before`, the state the previous launch saved, is given). Before each resumed segment, a fresh
    executor of its strategies loads the checkpoint: its state must be bit-equal to the state saved."""
    from tidal.runtime.ckptdir import resolve
    from tidal.runtime.train import prepare, train_worker

    rows, problems, state = [], [], before
    for k, (strategies, steps) in enumerate(segments):
        resume = k > 0 or before is not None  # the same on every rank (states are gathered on rank 0 only)
        job = prepare(config(world, strategies, steps, ckpt_dir, resume), world)
        if resume:
            got, opt_steps = loaded_state(job, resolve(ckpt_dir, job.spec).path)
            if rank == 0:
                problems += [f"{strategies}: {x}" for x in equal_states(got, state)]
        res = train_worker(rank, world, job, record=True)
        state = res.state
        if rank == 0:
            rows += [{"step": r["step"], "strategy": r["strategy"], "docs_run": r["docs_run"], "data": r["data"]}
                     for r in res.rows]
    return {"rows": rows, "problems": problems, "state": state} if rank == 0 else None
