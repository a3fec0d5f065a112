"""The executor's state in and out: DCP checkpoints of the sharded master weights and moments, and the gathered full
state for verification. A mixin of :class:`tidal.runtime.executor.Executor` (it reads ``optim``, ``table``, ``spec``,
``rank``, ``world`` and ``master_dtype``), kept apart so that the executor stays one readable file."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from tidal.runtime import checkpoint as ckpt
from tidal.runtime.optim import shard_range


class ExecutorState:
    def checkpoint_state(self) -> dict:
        """This rank's master and moment rows as a DCP state dict (runtime/checkpoint.py: logical full tensors named
        ``model.<param>``, ``optim.exp_avg.<param>``, ``optim.exp_avg_sq.<param>``; this rank's rows as one chunk)."""
        ranges = [shard_range(info.shape[0], self.world, self.rank) for info in self.table]
        return ckpt.row_state(self.spec, {"params": self.optim.params, "m": self.optim.m, "v": self.optim.v}, ranges)

    def save_checkpoint(self, path: str, step: int, state: dict | None = None, config: dict | None = None,
                        group=None) -> None:
        """Collective, synchronous: every rank writes its master and moment rows (DCP, runtime/checkpoint.py); rank 0
        adds `state` (JSON-safe: the planner's and the data's resumable state) and publishes the directory."""
        if self.rank == 0:
            ckpt.prepare_dir(path)
        dist.barrier(group=group)
        ckpt.begin_save(path, self.checkpoint_state(), group=group)
        ckpt.finish_save(path, self.spec, self.master_dtype, rank=self.rank, world=self.world, step=step,
                         optimizer_steps=self.optim.steps, state=state or {}, config=config, group=group)

    def load_checkpoint(self, path: str, group=None) -> dict:
        """Collective: every rank reads its rows of the master weights and moments (whatever world size or strategy
        wrote them); returns the checkpoint's metadata (step, state)."""
        meta = ckpt.load_meta(path, self.spec)
        ranges = [shard_range(info.shape[0], self.world, self.rank) for info in self.table]
        with torch.no_grad():
            ckpt.load_rows(path, self.spec, {"params": self.optim.params, "m": self.optim.m, "v": self.optim.v},
                           ranges, group=group)
        self.optim.steps = int(meta["optimizer_steps"])
        return meta

    def gather_state(self) -> dict[str, dict[str, np.ndarray]] | None:
        """Full master parameters and Adam moments on rank 0 (None elsewhere): for verification and checkpoints."""
        out: dict[str, dict[str, np.ndarray]] = {"params": {}, "m": {}, "v": {}}
        for key, tensors in (("params", self.optim.params), ("m", self.optim.m), ("v", self.optim.v)):
            parts: list = [None] * self.world
            dist.all_gather_object(parts, [t.detach().cpu().numpy() for t in tensors])
            for i, info in enumerate(self.table):
                out[key][info.name] = np.concatenate([parts[r][i] for r in range(self.world)])
        return out if self.rank == 0 else None


__all__ = ["ExecutorState"]
