"""Python's cyclic garbage collector at step boundaries, on every rank at once (decision 66).

With automatic collection a full (generation-2) pass starts whenever the allocation counters say so, inside
forward or backward. A rank process tracks about 318,000 objects once set up (torch, numpy, the corpus), so one pass
costs 150-185 ms of CPU time here, and ranks that allocate in lockstep run it at the same micro-batch: the
whole step stalls, and a calibration row measures 30 % more than the same work a step earlier. Megatron-LM
(`--manual-gc`) and torchtitan (`gc_freq`) take collection out of the step for the same reason.

`StepGC(every)` as a context manager, entered once setup is done:

- collects everything once and freezes the survivors (`gc.freeze`: model, optimizer, corpus and imports move to the
  permanent generation, which later passes do not scan);
- turns automatic collection off;
- `after_step(done)` collects every `every` steps, between steps and outside every timed region, and returns its
  CPU seconds (training reports them as `gc_s`). It collects the young generations (0 and 1: what the last steps
  allocated; well under a millisecond here), and every FULL_EVERY-th time the old one too. Objects created after
  the freeze that live on (modules imported lazily by the first plan, caches: about 78,000 objects on rank 0 of a
  2-rank run here) end in the old generation, and a full pass over them costs 10-25 ms, too much for every step;
- on exit, unfreezes and restores automatic collection as it was.

`every = 0` leaves Python's automatic collector alone (the behaviour before decision 66). Objects freed by reference
counting (tensors, autograd graphs) are freed at once either way; only reference cycles wait for the step boundary.
The collector is interpreter-wide state: use one StepGC at a time per process.
"""

from __future__ import annotations

import gc
import time

from tidal.core.errors import TidalError

FULL_EVERY = 50  # every 50th step-boundary collection also scans the old generation


class StepGC:
    def __init__(self, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise TidalError(f"gc_every must be an integer >= 0 (0 = Python's automatic collector), got {every!r}")
        self.every = every
        self._was_enabled: bool | None = None
        self._collections = 0

    def __enter__(self) -> StepGC:
        if self.every:
            self._was_enabled = gc.isenabled()
            gc.disable()
            gc.collect()
            gc.freeze()
        return self

    def __exit__(self, *exc) -> None:
        if self.every and self._was_enabled is not None:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
            self._was_enabled = None

    def after_step(self, done: int) -> float:
        """After `done` steps: a collection when `every` divides `done` (inside the context); its CPU seconds."""
        if not self.every or self._was_enabled is None or done % self.every:
            return 0.0
        self._collections += 1
        c0 = time.thread_time()
        gc.collect(2 if self._collections % FULL_EVERY == 0 else 1)
        return time.thread_time() - c0
