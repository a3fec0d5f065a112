"""Process lifecycle of a run: ranks and the planner process never outlive their launcher, and SIGTERM / SIGINT stop a
run at the next step boundary with a checkpoint (docs/training.md, "Lifecycle"; decision 80).

- :func:`die_with_parent` (every rank, the background planner): the kernel sends SIGKILL to this process when its
  parent dies (Linux ``prctl(PR_SET_PDEATHSIG)`` through ctypes), whatever killed the parent, ``kill -9`` included;
  a daemon watchdog thread polls the parent's pid as the fallback (other systems, or a parent that died before the
  prctl took effect) and ends the process the same way.
- :class:`StopRequest` (every rank): SIGTERM and SIGINT only set a flag, so no ``KeyboardInterrupt`` lands inside a
  collective. The training loop folds the flag into the per-step all-gather it already makes, so every rank sees every
  rank's flag and all take the same decision at the same step boundary: save a checkpoint, return, exit 128 + signal.
  A grace timer bounds the wait: a rank that does not reach a step boundary within ``grace_s`` after the signal exits
  on its own (128 + signal, one line on stderr), without a checkpoint.
- :class:`LauncherSignals` (the spawning launcher): the first SIGTERM / SIGINT is forwarded to every rank as
  received and starts the grace period; a second signal, or the end of the grace period, kills the ranks (SIGKILL).

Under torchrun the agent is the launcher: it sends SIGTERM to its workers and SIGKILL after its own timeout; the
workers here behave the same way (checkpoint at the next boundary within the grace period, exit 143, never 0).
Nothing here imports torch: the planner process uses it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
WATCH_S = 0.5  # how often the fallback watchdog checks that the parent is alive
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (cannot be our launcher, but do not kill on a guess)
        return True
    return True


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent thread exits; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int | None = None, on_orphan: Callable[[], None] | None = None) -> threading.Thread:
    """End this process when `parent_pid` (default: the current parent) dies: PR_SET_PDEATHSIG(SIGKILL) where the
    kernel has it, and a daemon watchdog thread in every case. Returns the watchdog thread."""
    pid = os.getppid() if parent_pid is None else int(parent_pid)
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != pid or not _alive(pid):  # the parent died before the prctl took effect
        _orphaned(on_orphan)

    def watch() -> None:
        while True:
            time.sleep(WATCH_S)
            if os.getppid() != pid or not _alive(pid):
                _orphaned(on_orphan)

    t = threading.Thread(target=watch, name="tidal-parent-watchdog", daemon=True)
    t.start()
    return t


def _orphaned(on_orphan: Callable[[], None] | None) -> None:
    if on_orphan is not None:
        on_orphan()
    os._exit(128 + signal.SIGKILL)


def exit_code_for(signum: int) -> int:
    """The exit code of a run stopped by `signum`: 128 + signum (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class StopRequest:
    """A rank's view of SIGTERM / SIGINT: `signum` is 0 until one arrives. Install in the main thread."""

    def __init__(self, grace_s: float, label: str = "rank") -> None:
        if not grace_s > 0:
            raise ValueError(f"grace_s must be > 0, got {grace_s}")
        self.grace_s = float(grace_s)
        self.label = label
        self.signum = 0
        self.at: float | None = None
        self._old: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self._done = threading.Event()

    def install(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.signum:
            return  # already stopping (a Ctrl-C reaches the rank and, forwarded, the launcher's SIGTERM too)
        self.signum, self.at = int(signum), time.monotonic()
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        if self._done.is_set():
            return
        name = signal.Signals(self.signum).name
        print(f"tidal: {self.label}: no step boundary within {self.grace_s:g} s after {name}; exiting without a "
              f"checkpoint", file=sys.stderr, flush=True)
        os._exit(exit_code_for(self.signum))

    def finished(self) -> None:
        """The stop was handled (checkpoint saved, loop left): the grace timer no longer applies."""
        self._done.set()
        if self._timer is not None:
            self._timer.cancel()

    def restore(self) -> None:
        self.finished()
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}


class LauncherSignals:
    """The spawning launcher's SIGTERM / SIGINT: recorded by the handler, acted on by the launcher's polling loop
    (`pending_forward`, `expired`). Restores the previous handlers on exit."""

    def __init__(self, grace_s: float, enabled: bool = True) -> None:
        self.grace_s = float(grace_s)
        self.enabled = enabled  # False: the previous handlers stay in force (nothing is ever requested)
        self.signum = 0
        self.count = 0
        self.at: float | None = None
        self.forwarded = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> LauncherSignals:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def _handle(self, signum, _frame) -> None:
        self.count += 1
        if not self.signum:
            self.signum, self.at = int(signum), time.monotonic()

    @property
    def requested(self) -> bool:
        return self.signum != 0

    def escalate(self) -> bool:
        """True once the ranks must be killed: a second signal, or the grace period is over."""
        return self.requested and (self.count > 1 or time.monotonic() - (self.at or 0.0) > self.grace_s)

    def forward(self, pids: list[int]) -> None:
        """Send the signal the launcher got to every live rank, once (the ranks treat SIGTERM and SIGINT alike)."""
        if self.forwarded:
            return
        self.forwarded = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, self.signum)
