"""One step's pull and push as streams of parameter groups (runtime/executor.py; docs/decisions.md 75).

Both post one `batch_isend_irecv` per parameter group on the resharding engine's p2p group, in one fixed group order
on every rank (messages between two ranks match in posting order, NCCL ignores tags), and complete the groups in the
same order. What differs is *when* a group may be posted and who may block:

- :class:`PullStream` (forward order: the embedding, each layer, norm + head). At most `window` groups that this rank
  receives into are in flight; a group this rank only sends from (it owns rows of it but its stage does not hold it)
  does not count and is posted as soon as every earlier group is. The forward pre-hook of a group's module completes
  every group up to it, in order, blocking, and each completion posts what the window then allows. Why send-only
  groups must not count: a rank of a later stage posts its part of an earlier stage's groups before its own forward
  can start (it waits for that stage's activations), so counting them would make it wait for a forward that waits
  for it.
- :class:`PushStream` (backward order: head first, the embedding last). A group is posted when its gradients are
  final on this rank (the executor counts the gradient hooks of the last micro-batch's backward; a group this rank
  holds no gradient of is ready at once), at most `window` groups in flight. Inside the backward nothing ever blocks:
  the oldest group in flight is only *polled* (`InFlight.poll`, a query of the work handles) and finished when done;
  a group that finds the window full waits, with its gradients, for a later hook or for :meth:`PushStream.finish`,
  which after the backward posts and waits the rest in order. A blocking wait inside the backward could deadlock
  under 1F1B: a group's owners include ranks of earlier stages, which post it only when their own backward gets
  there, after this rank's.

Each posted group's inputs are released when it is posted (sends are packed, a root's own addend copied): the pull's
master casts and the push's gradient buffer of that group (`release`), so a push swaps a group's gradients for its
packed sends instead of adding them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from tidal.core.errors import TidalError
from tidal.runtime.optim import shard_range
from tidal.runtime.reshard.execute import InFlight


class PullStream:
    """Posts and completes one step's pull groups (module docstring). `post(g)` starts group g's plan and returns its
    InFlight; `land(g, outs)` takes its outputs (the executor copies them into the module parameters). `receives[g]`:
    whether this rank has outputs in group g (holds its parameters)."""

    def __init__(self, receives: Sequence[bool], window: int, post: Callable[[int], InFlight],
                 land: Callable[[int, list], None]) -> None:
        if window < 1:
            raise TidalError(f"pull window must be at least 1 group, got {window}")
        self._receives, self._window, self._post, self._land = list(receives), window, post, land
        self._inflight: dict[int, InFlight] = {}
        self._next = 0  # the next group to post
        self._done = 0  # every group below it is complete
        self._open = 0  # groups this rank receives into, posted and not complete
        self.fill()

    @staticmethod
    def initial(receives: Sequence[bool], window: int) -> int:
        """How many groups are posted when the stream starts: every group up to the `window`-th one received into,
        and the send-only groups after it up to the next one received into."""
        count = 0
        for g, r in enumerate(receives):
            if r:
                if count == window:
                    return g
                count += 1
        return len(receives)

    def fill(self) -> None:
        n = len(self._receives)
        while self._next < n:
            g = self._next
            if self._receives[g]:
                if self._open >= self._window:
                    return
                self._open += 1
            self._inflight[g] = self._post(g)
            self._next += 1

    def need(self, g: int) -> None:
        """Complete every group up to g, in order (blocking), posting what each completion frees."""
        while self._done <= g and self._done < len(self._receives):
            j = self._done
            if j >= self._next:  # cannot happen with window >= 1: the oldest open group is always posted
                raise TidalError(f"pull group {j} needed before it was posted")
            outs = self._inflight.pop(j).wait()
            if self._receives[j]:
                self._open -= 1
            self._land(j, outs)
            self._done += 1
            self.fill()

    def finish(self) -> None:
        self.need(len(self._receives) - 1)

    @property
    def all_posted(self) -> bool:
        return self._next == len(self._receives)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)


class PushStream:
    """Posts and completes one step's push groups (module docstring). `post(q)` starts push group q (the executor
    frees that group's gradient buffer once it is posted); `land(q, outs)` takes the reduced shards. `ready[q]` is set
    by :meth:`final` (gradients final on this rank) and is true from the start for a group this rank holds no gradient
    of."""

    def __init__(self, holds: Sequence[bool], window: int, post: Callable[[int], InFlight],
                 land: Callable[[int, list], None], gate: Callable[[], bool] = lambda: True) -> None:
        if window < 1:
            raise TidalError(f"push window must be at least 1 group, got {window}")
        self._ready = [not h for h in holds]
        self._window, self._post, self._land, self._gate = window, post, land, gate
        self._inflight: deque[tuple[int, InFlight]] = deque()
        self._next = 0
        self.posted_in_backward = 0  # groups posted before finish(): what overlapped the backward
        self.in_backward = True  # until finish()

    def final(self, q: int) -> None:
        """Group q's gradients are final on this rank (no later backward adds to them)."""
        self._ready[q] = True
        self.advance()

    def advance(self) -> None:
        """Never blocks: finish the oldest groups whose operations completed, then post ready groups in order while
        the window has room."""
        while self._inflight and self._inflight[0][1].poll():
            q, fl = self._inflight.popleft()
            self._land(q, fl.finish_polled())
        if not self._gate():  # every rank posts the whole pull before any push (one order on the p2p group)
            return
        while self._next < len(self._ready) and self._ready[self._next] and len(self._inflight) < self._window:
            self._inflight.append((self._next, self._post(self._next)))
            self._next += 1

    def finish(self) -> None:
        """After the backward: every group is final; post and wait the rest in order, `window` in flight."""
        self.posted_in_backward = self._next
        self.in_backward = False
        self._ready = [True] * len(self._ready)
        if not self._gate():
            raise TidalError("push finished before the pull was posted")
        while True:
            self.advance()
            if not self._inflight:
                break
            q, fl = self._inflight.popleft()
            self._land(q, fl.wait())
        if self._next != len(self._ready):
            raise TidalError("push stream ended with groups never posted")


def check_layout(rank: int, world: int, table, held, pulls, pushes, k: int) -> None:
    """The runtime's module shards and the engine's annotations must agree on every parameter's local shape (`held`:
    this rank's parameter per table entry, None where its stage holds none). The pull reads the master shards (rows
    `shard_range` of every parameter) and the push the gradient buffers, whose shapes never change: checked here once
    per candidate, so the executor starts its plans with `checked=True` (no per-tensor check per step)."""
    for idx, plan in pulls:
        view = plan.rank_view(rank)
        for t, (i, mv) in enumerate(zip(idx, plan.moves)):
            want = mv.dst.local_shape(rank, table[i].shape)
            got = None if held[i] is None else tuple(held[i].shape)
            if want != got:
                raise TidalError(f"candidate {k}: {table[i].name} on rank {rank} is {got} in the model but {want} "
                                 f"in the resharding plan")
            shape = table[i].shape
            lo, hi = shard_range(shape[0], world, rank)
            if view.want[t] != (hi - lo, *shape[1:]):
                raise TidalError(f"candidate {k}: master rows of {table[i].name} on rank {rank} do not match the pull "
                                 f"plan's source box {view.want[t]}")
    for idx, plan in pushes:
        view = plan.rank_view(rank)
        for t, i in enumerate(idx):
            got = None if held[i] is None else tuple(held[i].shape)
            if view.want[t] != got:
                raise TidalError(f"candidate {k}: {table[i].name} on rank {rank} is {got} in the model but "
                                 f"{view.want[t]} in the push plan")


__all__ = ["PullStream", "PushStream", "check_layout"]
