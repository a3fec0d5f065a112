"""Per-collective timeouts that name the rank that did not arrive (docs/training.md, "Timeouts"; decision 80).

Every rank publishes where it is -- (step, operation, when it got there) -- in a small shared-memory table the
spawning launcher created (:class:`Progress`; one writer per row, no lock). The launcher's :class:`HangMonitor` reads
the table while it waits for results. A rank is named when

- it is *behind*: nobody has moved for `timeout_s` seconds and some rank is at a later (step, operation) than it, so
  those ranks wait at a collective it has not reached; or
- it is *stopped* (``/proc/PID/stat`` state T, e.g. SIGSTOP) and has not moved for `timeout_s` seconds.

The wait is per collective, not per run: a run of any length goes on as long as no rank waits longer than
`timeout_s` for another (so the timeout must exceed the longest legitimate skew between ranks at a collective; a
long step where every rank computes is not a wait). The whole-run deadline of earlier versions is optional and off by
default. Under torchrun there is no launcher to watch: the process group's own timeout (the same `timeout_s`) raises
in the waiting ranks, which report their step and operation.

Nothing here imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# operations in the order a step runs them (a later index at the same step is further on)
PHASES = ("start-up", "plan broadcast", "train step", "forward/backward", "push", "metrics all-gather", "checkpoint",
          "finished")
_PROBE_PHASE = {"pull": "forward/backward", "backward": "push", "push": "push"}  # Executor.probe names -> operation
_FIELDS = 3  # step, phase index, monotonic time of the mark
STARTUP_S = 300.0  # a rank still starting up (imports, groups, warm-up) is named only after max(timeout, this)


@dataclass(frozen=True)
class Mark:
    rank: int
    step: int
    phase: str
    at: float  # time.monotonic() (CLOCK_MONOTONIC: the same clock in every process of the machine)

    @property
    def position(self) -> tuple[int, int]:
        return self.step, PHASES.index(self.phase)

    def where(self) -> str:
        return f"step {self.step} {self.phase}" if self.step else self.phase


class Progress:
    """Where each rank is; `ctx` is the multiprocessing context the ranks are spawned with (shared memory), or None
    for a process-local table (torchrun: nobody else reads it). Picklable into spawned processes as an argument."""

    def __init__(self, world: int, ctx: Any = None) -> None:
        self.world = world
        n = world * _FIELDS
        self.buf = ctx.Array("d", n, lock=False) if ctx is not None else [0.0] * n
        now = time.monotonic()
        for r in range(world):
            self.buf[r * _FIELDS + 2] = now

    def mark(self, rank: int, step: int, phase: str) -> None:
        i = rank * _FIELDS
        self.buf[i + 2] = time.monotonic()
        self.buf[i + 1] = float(PHASES.index(phase))
        self.buf[i] = float(step)

    def probe(self, rank: int, step: int):
        """A callable for Executor.probe: marks the operation a probe point leads into."""
        return lambda name: self.mark(rank, step, _PROBE_PHASE.get(name, "train step"))

    def get(self, rank: int) -> Mark:
        i = rank * _FIELDS
        return Mark(rank, int(self.buf[i]), PHASES[int(self.buf[i + 1])], float(self.buf[i + 2]))

    def marks(self) -> list[Mark]:
        return [self.get(r) for r in range(self.world)]


class RankMarks:
    """One rank's handle on the table (what the training loop calls)."""

    def __init__(self, progress: Progress | None, rank: int) -> None:
        self.progress, self.rank = progress, rank

    def __call__(self, step: int, phase: str) -> None:
        if self.progress is not None:
            self.progress.mark(self.rank, step, phase)

    def probe(self, step: int):
        return None if self.progress is None else self.progress.probe(self.rank, step)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, D, T, t, Z, ...), or "" where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :][:1]


class HangMonitor:
    """The launcher's check of a run's :class:`Progress`; `check(pids)` returns a one-line diagnosis or None."""

    def __init__(self, progress: Progress, timeout_s: float) -> None:
        self.progress, self.timeout_s = progress, float(timeout_s)

    def laggards(self, pids: list[int], now: float | None = None, stale_s: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        stale_s = self.timeout_s if stale_s is None else stale_s
        marks = self.progress.marks()
        stopped = [m for m, pid in zip(marks, pids) if process_state(pid) in ("T", "t") and now - m.at >= stale_s]
        if stopped:
            m = stopped[0]
            ahead = max(marks, key=lambda x: x.position)
            there = (f"did not arrive at {ahead.where()}" if ahead.position > m.position
                     else "did not arrive at its peers' next collective")
            return (f"rank {m.rank} is stopped (SIGSTOP or a debugger) at {m.where()} and {there} within "
                    f"{self.timeout_s:g} s (collective timeout)")
        if any(now - m.at < stale_s for m in marks):
            return None  # someone moved within the timeout: no collective has waited that long
        lo, hi = min(m.position for m in marks), max(m.position for m in marks)
        if lo == hi:
            return None  # every rank at the same operation: computing, not waiting for one another
        behind = [m for m in marks if m.position == lo]
        if stale_s > 0 and behind[0].phase == "start-up" and now - behind[0].at < max(stale_s, STARTUP_S):
            return None  # start-up skew (imports on a loaded machine) is not a hang yet
        ahead = next(m for m in marks if m.position == hi)
        names = ", ".join(str(m.rank) for m in behind)
        return (f"rank{'s' if len(behind) > 1 else ''} {names} did not arrive at {ahead.where()} within "
                f"{self.timeout_s:g} s (collective timeout; still at {behind[0].where()})")

    def check(self, pids: list[int]) -> str | None:
        return self.laggards(pids)

    def explain(self, pids: list[int]) -> str | None:
        """After a rank reported a collective error: the rank(s) behind or stopped, whatever their age (or None)."""
        return self.laggards(pids, stale_s=0.0)
