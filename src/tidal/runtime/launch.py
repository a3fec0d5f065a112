"""Spawn `world_size` local processes joined by a gloo (or nccl) process group over a FileStore.

A FileStore in a fresh temporary directory avoids TCP port races between concurrent tests. Each worker runs
`fn(rank, world_size, *args)`; its return value is pickled back to the parent, and any worker exception is re-raised
in the parent (:class:`RunFailure`: one line naming the rank, the worker's traceback in ``.detail``).

Lifecycle (runtime/lifecycle.py, decision 80): every rank dies with the launcher (PR_SET_PDEATHSIG and a watchdog on
the launcher's pid), so no rank outlives a ``kill -9`` of the launcher. With `grace_s`, the launcher's SIGTERM/SIGINT
is forwarded to the ranks as SIGTERM (they checkpoint at the next step boundary and return); a second signal or the
end of the grace period kills them. With a `monitor` (runtime/guard.py) a rank that does not arrive at a collective
within the collective timeout is named; the whole-run deadline `timeout_s` is optional (None: none).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing import util as mp_util
from queue import Empty
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from tidal.core.errors import EXIT_RANK, EXIT_TIMEOUT, RunFailure
from tidal.runtime.lifecycle import LauncherSignals, die_with_parent, exit_code_for


def cuda_defaults(tf32: bool = True) -> None:
    """A CUDA rank's numeric defaults, set where the rank process starts (never at import): TF32 for fp32 matmuls
    and cuDNN convolutions unless `tf32` is False (`[train] tf32`; fp32 master-weight arithmetic outside the bf16
    compute keeps full precision: the optimizer's element-wise ops do not use TF32)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def all_initialised(store, world_size: int, poll_s: float = 0.005) -> None:
    """Return once every rank's `init_process_group` has returned (a counter in the store, no collective). Without
    it a rank whose function ends at once can leave, and close its gloo pairs, while a peer is still connecting its
    full mesh ("Connection closed by peer" in that peer's init, seen in CI). The launcher's overall timeout bounds the
    wait."""
    store.add("tidal/initialised", 1)
    while store.add("tidal/initialised", 0) < world_size:
        time.sleep(poll_s)


def _worker(rank: int, world_size: int, store_path: str, backend: str, timeout_s: float, fn: Callable, args: tuple,
            queue: Any, launcher: int) -> None:
    die_with_parent(launcher)  # never outlive the launcher, whatever ends it (kill -9 included)
    try:
        if backend == "nccl":  # one GPU per rank (round robin over the visible devices)
            import torch

            torch.cuda.set_device(rank % torch.cuda.device_count())
            cuda_defaults()
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        all_initialised(store, world_size)
        try:
            result = fn(rank, world_size, *args)
            queue.put((rank, True, result))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, traceback.format_exc()))
        return
    # Reported: leave now. The interpreter's own shutdown (finalisers of torch and gloo objects) takes seconds on a
    # loaded machine, which would hold a stopping run's processes alive past the launcher's wait for no purpose.
    queue.close()
    queue.join_thread()  # the result is in the pipe
    # os._exit skips multiprocessing's exit finalizers; run those that unlink named semaphores (torch.compile makes
    # tqdm create one), or the launcher's resource tracker reports them leaked at its exit (decision 160)
    mp_util._run_finalizers(0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _died(procs, r: int) -> str:
    return f"rank {r} died with exit code {procs[r].exitcode} before reporting (crashed at start-up or was killed)"


def _last_line(tb: str) -> str:
    """The exception line of a traceback text, without the module path of its type."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else "an exception"
    head, sep, rest = last.partition(": ")
    return (head.rsplit(".", 1)[-1] + sep + rest) if sep else last.rsplit(".", 1)[-1]


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _peer_lost(payload: str) -> bool:
    """A traceback that only says a peer went away (gloo's pair errors): the symptom, not the cause."""
    return any(m in _last_line(payload) for m in _PEER_LOST)


def _root_cause(queue, results: dict, rank: int, payload: str, wait_s: float) -> tuple[int, str]:
    """Reports that arrive within `wait_s` after a peer-lost one: the first failure that is not itself a peer loss
    (e.g. the rank whose background planner raised), else the report we had."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            r, ok, p = queue.get(timeout=max(0.05, end - time.monotonic()))
        except Empty:
            break
        if ok:
            results[r] = p
        elif not _peer_lost(p):
            return r, p
    return rank, payload


def _dead_unreported(procs, results: dict, reporter: int, wait_s: float) -> int | None:
    """The first rank (other than `reporter`) that exited non-zero without a result, polled for up to `wait_s`."""
    end = time.monotonic() + wait_s
    while True:
        dead = [r for r, p in enumerate(procs) if r != reporter and r not in results and p.exitcode not in (None, 0)]
        if dead or time.monotonic() >= end:
            return dead[0] if dead else None
        time.sleep(0.05)


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                    timeout_s: float | None = 120.0, collective_timeout_s: float | None = None, monitor: Any = None,
                    grace_s: float | None = None) -> list[Any]:
    """Run fn on `world_size` spawned ranks; return the per-rank results in rank order.

    Fails (:class:`RunFailure`, a RuntimeError: one line naming the rank, its traceback in the message and in
    ``.detail``) as soon as a rank raises or dies without a result (e.g. at import); when `monitor`
    (guard.HangMonitor) names a rank that did not arrive at a collective; and, if `timeout_s` is not None, after
    `timeout_s` seconds overall, naming the ranks that had not finished. `collective_timeout_s` is the process
    group's timeout (default: `timeout_s`, else 1800 s). With `grace_s`, SIGTERM/SIGINT are handled (module doc)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    pg_timeout = collective_timeout_s or timeout_s or 1800.0
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="tidal-store-") as tmp, \
            LauncherSignals(grace_s or 0.0, enabled=grace_s is not None) as sig:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, store_path, backend, pg_timeout, fn, args, queue,
                                              os.getpid()), daemon=False)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        pids = [p.pid for p in procs]
        results: dict[int, Any] = {}
        error: str | None = None
        detail, code = "", EXIT_RANK
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(results) < world_size and error is None:
            if sig.requested:
                sig.forward([p.pid for p in procs if p.is_alive()])
                if sig.escalate():
                    missing = [r for r in range(world_size) if r not in results]
                    name = signal.Signals(sig.signum).name
                    why = "a second signal" if sig.count > 1 else f"no step boundary within {sig.grace_s:g} s"
                    error, code = f"interrupted by {name}: ranks {missing} killed ({why}); no checkpoint at this " \
                                  f"step", exit_code_for(sig.signum)
                    continue
            try:
                rank, ok, payload = queue.get(timeout=0.5)
            except Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                if dead:
                    try:  # a rank may have reported just before exiting
                        rank, ok, payload = queue.get(timeout=2.0)
                    except Empty:
                        error = _died(procs, dead[0])
                        if sig.requested:
                            code = exit_code_for(sig.signum)
                        continue
                elif monitor is not None and (hang := monitor.check(pids)) is not None:
                    error, code = hang, EXIT_TIMEOUT
                    continue
                elif deadline is not None and time.monotonic() > deadline:
                    missing = [r for r in range(world_size) if r not in results]
                    error, code = f"timed out after {timeout_s:.0f} s waiting for ranks {missing}", EXIT_TIMEOUT
                    continue
                else:
                    continue
            if ok:
                results[rank] = payload
            else:
                if _peer_lost(payload):  # a symptom: the rank whose failure broke the connection may report next
                    rank, payload = _root_cause(queue, results, rank, payload, wait_s=2.0)
                error, detail = f"rank {rank} raised {_last_line(payload)}", payload
                # A rank that died without reporting is the likelier cause (its peers then fail in their collectives,
                # e.g. gloo's "Connection closed by peer"), and its death can reach us after their reports: name it.
                dead = _dead_unreported(procs, results, rank, wait_s=1.0)
                if dead is not None:
                    error = f"{_died(procs, dead)}; then {error}"
                elif monitor is not None and (why := monitor.explain(pids)) is not None \
                        and not why.startswith(f"rank {rank} "):
                    error, code = f"{why}; then {error}", EXIT_TIMEOUT  # the peer it waited for, named first
        if error is not None:
            for p in procs:
                if p.is_alive():
                    p.kill()
        # Every rank has reported: give teardown (destroy_process_group, flushing the result queue) a minute, which a
        # loaded machine can need; a rank still alive then is killed, but its result is already in, so that is not a
        # failure. A rank that exits non-zero on its own after reporting is.
        killed = set()
        grace = time.monotonic() + (60.0 if error is None else 10.0)
        for r, p in enumerate(procs):
            p.join(timeout=max(0.1, grace - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
                killed.add(r)
        if error is not None:
            raise RunFailure("distributed worker failed: " + error, detail, exit_code=code)
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (0, None) and r not in killed]
        if bad:
            raise RunFailure(f"distributed workers exited with codes {bad}")
    return [results[r] for r in range(world_size)]
