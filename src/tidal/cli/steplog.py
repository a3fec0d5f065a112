"""What `tidal train` says while it runs (issue 26 item 3).

* One line per step: a plain flushed line when stdout is not a terminal (a log file, torchrun, a SLURM job), where a
  progress bar would show nothing until the end; on a terminal the same line, printed above a progress bar::

      step 3/20 | loss 5.4321 | 12,345 tok/s | tp2+2*tp1 | rss 0.41 0.40 0.39 0.40 GiB | MFU 2.1% (nominal) | 0.52 s

  Memory is every rank's peak so far (runtime.train.peak_memory_bytes): ``mem`` is CUDA's ``max_memory_allocated``,
  ``rss`` a CPU rank's peak resident set size (it includes the interpreter and torch, ~0.3-0.4 GiB). Up to
  `LIST_RANKS` ranks are listed; beyond, the largest (with its rank) and the smallest. MFU is the step's model FLOPs
  (costmodel/flops.py) over its wall time and the cluster's peak FLOP/s; "(nominal)" when a device type's peak
  is a nominal figure (the `cpu` type), and no MFU at all when a device type has no peak.
* Start-up and event lines on stderr, stamped with the UTC time (launcher and ranks are different processes):
  planning, spawning ranks, warm-up, the first step, resumes and completed checkpoints.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

LIST_RANKS = 4  # memory of up to this many ranks is listed one by one


def memory_text(row: dict) -> str:
    """The row's per-rank peak memory (`peak_mem_bytes`, `mem_kind`), or "" when the row has none."""
    mem = row.get("peak_mem_bytes")
    if not mem:
        return ""
    label = "mem" if row.get("mem_kind") == "cuda" else "rss"
    gib = [b / 2**30 for b in mem]
    if len(gib) <= LIST_RANKS:
        return f"{label} {' '.join(f'{g:.2f}' for g in gib)} GiB"
    top = max(range(len(gib)), key=gib.__getitem__)
    return f"{label} max {gib[top]:.2f} GiB (rank {top}), min {min(gib):.2f} GiB"


def mfu_text(row: dict, nominal: bool) -> str:
    """'MFU 41.2%' from the row's `mfu` (None or absent: "")."""
    u = row.get("mfu")
    if u is None:
        return ""
    return f"MFU {100 * u:.{1 if u >= 1e-3 else 3}f}%" + (" (nominal)" if nominal else "")


def step_fields(row: dict, nominal: bool = False) -> list[str]:
    """The fields of a step line after the step counter: loss, throughput, strategy, memory, MFU."""
    out = [f"loss {row['loss']:.4f}", f"{row['tokens_per_s']:,.0f} tok/s", str(row["strategy"])]
    return out + [t for t in (memory_text(row), mfu_text(row, nominal)) if t]


def step_line(row: dict, total: int, nominal: bool = False) -> str:
    return " | ".join([f"step {row['step'] + 1}/{total}", *step_fields(row, nominal), f"{row['wall_s']:.2f} s"])


def plain_output(stream=None) -> bool:
    """True when `stream` (stdout) is not a terminal."""
    s = sys.stdout if stream is None else stream
    return not (hasattr(s, "isatty") and s.isatty())


def nominal_peak(cluster) -> bool:
    """True when some device type's peak FLOP/s is a nominal figure (not calibrated: the `cpu` type)."""
    return any(not g.device.calibrated for g in cluster.groups)


def printer(total: int, stream=None, nominal: bool = False, writers=()) -> Callable[[dict], None]:
    """An `on_step` callback: one flushed line per step to `stream` (stdout), and the row to every writer
    (cli/writers.py)."""

    def on_step(row: dict) -> None:
        print(step_line(row, total, nominal), file=stream or sys.stdout, flush=True)
        for w in writers:
            w.write(row)

    return on_step


def writer_callback(writers) -> Callable[[dict], None]:
    """An `on_step` callback that only hands each row to the writers (`[train] progress = false`)."""

    def on_step(row: dict) -> None:
        for w in writers:
            w.write(row)

    return on_step


def announcer(stream=None, clock: Callable[[], float] = time.time) -> Callable[[str], None]:
    """A `log` callback: '[tidal HH:MM:SS] line' (UTC), flushed, to `stream` (stderr)."""

    def say(line: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime(clock()))
        print(f"[tidal {stamp}] {line}", file=stream or sys.stderr, flush=True)

    return say
