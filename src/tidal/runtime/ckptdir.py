"""A checkpoint directory: ``step-NNNNNN`` checkpoints, the ``latest`` pointer, keep-the-last-K, the verified fallback
on resume, metrics rows cut back to the checkpoint, and the training loop's (possibly asynchronous) :class:`Saver`.

Resume rule (docs/training.md): the checkpoint ``latest`` names is verified (runtime/checkpoint.verify: manifest
present, every file present with its recorded size and sha256); when it is missing or damaged, the newest other
``step-*`` that verifies is used, and one line says which was skipped and why. A checkpoint directory without a
manifest (a save interrupted before its end) never counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.runtime import checkpoint as ckpt

_STEP = re.compile(r"^step-(\d{6,})$")


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``step-N`` directory (complete or not), newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in d.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return sorted(out, reverse=True)


@dataclass(frozen=True)
class Resume:
    path: str
    meta: dict
    note: str  # one line when the checkpoint `latest` names was not used ("" otherwise)


def resolve(directory: str | Path, spec: ModelSpec | None) -> Resume:
    """The checkpoint to resume from: `latest`'s if it verifies, else the newest that does (see module doc)."""
    d = Path(directory)
    pointer = d / "latest"
    skipped: list[str] = []
    named = None
    try:
        named = pointer.read_text().strip()
    except OSError:
        skipped.append(f"{pointer} is missing")
    except UnicodeDecodeError:
        skipped.append(f"{pointer} is unreadable")
    order = [p for _, p in checkpoints(d)]
    if named is not None:
        first = d / named
        if not _STEP.match(named) or not first.is_dir():
            skipped.append(f"{pointer} names {named[:60]!r}, which is not a checkpoint here")
        else:
            order = [first] + [p for p in order if p != first]
    for p in order:
        try:
            meta = ckpt.verify(p, spec)
        except TidalError as e:
            if "does not match model" in str(e):
                raise
            skipped.append(str(e))
            continue
        note = "" if not skipped else f"resume: {skipped[0]}; using {p.name} (step {meta['step']}), the newest " \
                                      f"complete, verified checkpoint" + \
                                      (f" ({len(skipped) - 1} more skipped)" if len(skipped) > 1 else "")
        return Resume(str(p), meta, note)
    if not order and named is None:
        raise TidalError(f"resume: no checkpoint in {directory} (no latest, no step-* directory)")
    why = f" ({skipped[-1]})" if skipped else ""
    raise TidalError(f"resume: no complete, verified checkpoint in {directory}{why}")


def publish(directory: str | Path, step: int) -> None:
    """Rank 0: point ``latest`` at step-N (atomically)."""
    tmp = Path(directory) / "latest.tmp"
    tmp.write_text(step_name(step) + "\n")
    os.replace(tmp, Path(directory) / "latest")


def prune(directory: str | Path, keep: int, newest: int) -> list[Path]:
    """Rank 0, after step `newest` was published: remove complete checkpoints beyond the newest `keep` (0 keeps all)
    and any step directory or ``.partial`` that is not complete and older than `newest`. Returns what went."""
    gone = []
    complete = 0
    for step, p in checkpoints(directory):
        ok = (p / ckpt.MANIFEST).is_file()
        complete += ok
        if step < newest and ((ok and keep and complete > keep) or not ok):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    for p in Path(directory).glob("step-*.partial"):
        m = _STEP.match(p.name[: -len(".partial")])
        if m and int(m.group(1)) < newest:
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def truncate_metrics(path: str | Path, step: int) -> int:
    """Keep only the rows of steps < `step` (those the checkpoint includes) in a metrics JSONL file, atomically, so
    a resumed run never duplicates rows. Returns how many rows were dropped."""
    p = Path(path)
    if not p.exists():
        return 0
    keep, dropped = [], 0
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        try:
            s = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            s = None  # a torn last line (killed mid-write): dropped with the rows after the checkpoint
        if isinstance(s, int) and s < step:
            keep.append(line)
        else:
            dropped += 1
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, p)
    return dropped


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Saver:
    """A training run's checkpoints (every rank constructs one, at the same point: it creates a process group).

    `save` waits for the previous save to finish, then starts this one: synchronous, or with ``dcp.async_save``
    (`use_async`), where it returns once a CPU copy is staged and the writing overlaps the next step. `step_done`
    (every step boundary) finishes a save started before the step that just ended: checksums, manifest, ``latest``,
    pruning; `close` finishes whatever is in flight. `blocked_s` is the time the loop spent in checkpointing since
    the last `take_blocked`. `own_group=False` (synchronous only) uses the default group. `announce` (rank 0's)
    gets one line per checkpoint once it is complete and `latest` points at it."""

    def __init__(self, directory: str, *, keep: int = 3, use_async: bool = False, config: dict | None = None,
                 own_group: bool = True, announce: Callable[[str], None] | None = None) -> None:
        if keep < 0:
            raise TidalError(f"[train] keep_checkpoints must be >= 0 (0 keeps all), got {keep}")
        self.directory, self.keep, self.use_async, self.config = directory, keep, use_async, config
        # async writes run their collectives in a background thread: on a gloo group of their own (DCP's advice)
        self.group = dist.new_group(backend="gloo") if own_group else None
        self.blocked_s = 0.0
        self._pending: tuple | None = None  # (executor, step, optimizer steps, state, future) of the save in flight
        self.announce = announce
        self._t_start = 0.0
        self._started_at = -1

    def save(self, executor, step: int, state: dict) -> None:
        t0 = time.perf_counter()
        self.finish()
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        path = str(Path(self.directory) / step_name(step))
        if executor.rank == 0:
            ckpt.prepare_dir(path)
        dist.barrier(group=self.group)
        self._t_start = time.perf_counter()
        fut = ckpt.begin_save(path, executor.checkpoint_state(), group=self.group, use_async=self.use_async)
        self._pending = (executor, step, executor.optim.steps, state, fut)
        self._started_at = step
        if not self.use_async:
            self.finish()
        self.blocked_s += time.perf_counter() - t0

    def step_done(self, step: int) -> None:
        """Every rank, at every step boundary after the save's own step."""
        if self._pending is not None and step > self._started_at:
            t0 = time.perf_counter()
            self.finish()
            self.blocked_s += time.perf_counter() - t0

    def finish(self) -> None:
        if self._pending is None:
            return
        executor, step, opt_steps, state, fut = self._pending
        self._pending = None
        if fut is not None:
            fut.result()
        path = Path(self.directory) / step_name(step)
        ckpt.finish_save(path, executor.spec, executor.master_dtype, rank=executor.rank, world=executor.world,
                         step=step, optimizer_steps=opt_steps,
                         state=state, config=self.config, group=self.group)
        if executor.rank == 0:
            publish(self.directory, step)
            prune(self.directory, self.keep, step)
            if self.announce is not None:
                self.announce(f"checkpoint saved: {path} (step {step}, "
                              f"{'async, ' if self.use_async else ''}{time.perf_counter() - self._t_start:.1f} s)")
        dist.barrier(group=self.group)

    def take_blocked(self) -> float:
        out, self.blocked_s = self.blocked_s, 0.0
        return out

    close = finish
