"""Single-micro-batch pipelines filled first (issue 9, decision 68): the `fill` pass's re-dispatch. A PP = 1 pipeline
whose longest document is too heavy for two micro-batches under a time `cap` runs one micro-batch of at most MaxLen
tokens; `fill_dispatch` fills such pipelines first (best fit, longest first), the rest by the dispatch's greedy, then
the local search. docs/planner.md, "Eleventh round", states why; `worth_filling` is the cheap test before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan
from tidal.planner.bounds import PipeCost
from tidal.planner.dispatch import greedy_owner, owner_result
from tidal.planner.pipecost import pipe_coeffs


def _too_heavy(pc: PipeCost, x: float, cap: float) -> bool:
    """A document of length x cannot run in two micro-batches within `cap` on a PP = 1 pipeline."""
    return 2 * (pc.c + pc.w1(x)) > cap


def single_pipes(lengths: np.ndarray, pipes: Sequence[PipeCost], plans: Sequence[PipelinePlan],
                 cap: float) -> list[tuple[int, int]]:
    """(pipeline, index of its longest document) for every PP = 1 pipeline of `plans` whose longest document cannot
    share a pipeline time <= `cap` with a second micro-batch (ties to the lowest index)."""
    out = []
    for j, (pl, pc) in enumerate(zip(plans, pipes)):
        idx = [i for mb in pl.micro_batches for i in mb]
        if pc.pp != 1 or not idx:
            continue
        i_long = min(idx, key=lambda i: (-int(lengths[i]), i))
        if _too_heavy(pc, float(lengths[i_long]), cap):
            out.append((j, i_long))
    return out


def worth_filling(lengths: np.ndarray, pipes: Sequence[PipeCost], plans: Sequence[PipelinePlan], cap: float,
                  est: float, under: float = 0.02, room: float = 0.02) -> bool:
    """The cheap test before `fill_dispatch`: some PP = 1 pipeline runs one micro-batch at least a factor `under`
    below the step estimate `est`, holds more than (1 - `room`) of its MaxLen, and its longest document is too heavy
    for two micro-batches under `cap`. Without one, filling first has nothing to move. Only such pipelines' documents
    are read (hundreds of pipelines at 1024 GPUs)."""
    for pl, pc in zip(plans, pipes):
        if pc.pp != 1 or len(pl.micro_batches) != 1 or pl.est_time > est * (1 - under):
            continue
        x = lengths[np.asarray(pl.micro_batches[0], dtype=np.int64)]
        if int(x.sum()) < (1 - room) * pc.max_len:
            continue
        if _too_heavy(pc, float(x.max()), cap):
            return True
    return False


def fill_dispatch(lengths: np.ndarray, pipes: Sequence[PipeCost], plans: Sequence[PipelinePlan], cap: float,
                  rounds: int | None = None, deadline: float | None = None) -> tuple[tuple[int, ...], ...] | None:
    """The re-dispatch of the module doc (groups of ascending indices per pipeline), or None when `plans` has no
    single-micro-batch pipeline, or every pipeline is one and some document fits in none of them. `deadline`
    (perf_counter) cuts the local search short; the groups are valid either way."""
    single = single_pipes(lengths, pipes, plans, cap)
    if not single:
        return None
    n = len(pipes)
    lf = lengths.astype(np.float64)
    owner = np.full(lengths.size, -1, dtype=np.int64)
    js = np.array([j for j, _ in single], dtype=np.int64)
    A, B, load, D = pipe_coeffs([pipes[j] for j in js])  # load: c, plus the work placed
    room = np.array([float(pipes[j].max_len) for j in js])
    for s, (j, i) in enumerate(single):
        owner[i] = j
        room[s] -= lf[i]
        load[s] += A[s] * lf[i] ** 2 + B[s] * lf[i] + D[s]
    rmax, smallest = float(room.max()), float(lf.min())
    for i in np.argsort(-lengths, kind="stable").tolist():
        if rmax < smallest:
            break  # no room left for any document
        x = lf[i]
        if owner[i] >= 0 or x > rmax:
            continue
        new = load + A * x * x + B * x + D
        ok = (room >= x) & (new <= cap)
        if ok.any():
            s = int(np.argmin(np.where(ok, room, np.inf)))  # best fit: the least room that holds it
            owner[i] = js[s]
            room[s] -= x
            load[s] = new[s]
            rmax = float(room.max())
    rest = np.setdiff1d(np.arange(n), js)
    free = np.flatnonzero(owner < 0)
    if free.size:
        if not rest.size:
            return None
        sub = lengths[free]
        try:
            owner[free] = rest[greedy_owner(sub, [pipes[j] for j in rest], np.argsort(-sub, kind="stable"))]
        except TidalError:  # a document longer than every other pipeline's MaxLen
            return None
    return owner_result(lengths, pipes, owner, 20 + n if rounds is None else rounds, deadline=deadline).groups
