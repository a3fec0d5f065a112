"""Spawn `world_size` local processes joined by a gloo (or nccl) process group over a FileStore.

A FileStore in a fresh temporary directory avoids TCP port races between concurrent tests. Each worker runs
`fn(rank, world_size, *args)`; its return value is pickled back to the parent, and any worker exception is re-raised
in the parent with the worker's traceback in the message.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world_size: int, store_path: str, backend: str, timeout_s: float, fn: Callable, args: tuple,
            queue: Any) -> None:
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        try:
            result = fn(rank, world_size, *args)
            queue.put((rank, True, result))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, traceback.format_exc()))


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                    timeout_s: float = 120.0) -> list[Any]:
    """Run fn on `world_size` spawned ranks; return the per-rank results in rank order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="tidal-store-") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, store_path, backend, timeout_s, fn, args, queue),
                        daemon=False)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        for _ in range(world_size):
            rank, ok, payload = queue.get()
            if ok:
                results[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
                break
        if errors:
            for p in procs:
                p.kill()
        for p in procs:
            p.join(timeout=timeout_s)
            if p.is_alive():
                p.kill()
        if errors:
            raise RuntimeError("distributed worker failed\n" + "\n".join(errors))
        bad = [p.exitcode for p in procs if p.exitcode not in (0, None)]
        if bad:
            raise RuntimeError(f"distributed workers exited with codes {bad}")
    return [results[r] for r in range(world_size)]
