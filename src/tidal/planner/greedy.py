"""The dispatch's greedy start (list scheduling, longest first) with its jump scan: the pipelines' arrays
(`greedy_prep`) and the call of its one loop, `kernels.greedy` (compiled, or plain Python without numba).
`dispatch.py` and `fill.py` use `greedy_owner` and `greedy_prep`."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost, group_pipes
from tidal.planner.pipecost import pipe_coeffs


def greedy_prep(pipes: Sequence[PipeCost]) -> tuple:
    """What greedy_owner needs of the pipelines alone: kernels.greedy's arrays of the classes of identical pipelines
    and their members (ascending). Computed once per dispatch, shared by its restarts."""
    classes, _ = group_pipes(pipes)
    members: list[list[int]] = [[] for _ in classes]
    cls_of = {p: k for k, p in enumerate(classes)}
    for j, p in enumerate(pipes):
        members[cls_of[p]].append(j)
    mcount = np.array([len(m) for m in members], dtype=np.int64)
    return (*pipe_coeffs(classes), np.array([p.q for p in classes], dtype=np.float64),
            np.array([p.max_len for p in classes], dtype=np.int64),
            np.array([j for m in members for j in m], dtype=np.int64),
            np.concatenate([[0], np.cumsum(mcount)[:-1]]).astype(np.int64), mcount,
            np.array([p.max_len for p in pipes], dtype=np.int64))


def greedy_owner(lengths: np.ndarray, pipes: Sequence[PipeCost], order: np.ndarray | None = None,
                 loops: SimpleNamespace | None = None, prep: tuple | None = None, scan: bool = True) -> np.ndarray:
    """List scheduling: each sequence (longest first unless `order`) to the eligible pipeline with the least resulting
    cost. Per class of identical pipelines two are tried: the first empty one and the least-loaded used one, or every
    used one (`scan`, decision 63) when adding to the least-loaded one costs more than the sequence's work plus one
    micro-batch constant (a PP = 1 pipeline over its MaxLen with a long document jumps to 2 (c + w(l_max)); a fuller
    pipeline with room is then cheaper).
    Runs `loops.greedy` (kernels.greedy, the one source): `loops` None takes kernels.loops(), compiled where numba is
    installed; kernels.PLAIN runs it as plain Python. `prep`: greedy_prep(pipes), when the caller has it."""
    if loops is None:
        from tidal.planner import kernels

        loops = kernels.loops()
    arrays = greedy_prep(pipes) if prep is None else prep
    if order is None:
        order = np.argsort(-lengths, kind="stable")
    owner, bad = loops.greedy(lengths.astype(np.int64, copy=False), order.astype(np.int64, copy=False), *arrays, scan)
    if bad >= 0:
        raise TidalError(f"sequence of length {int(lengths[bad])} exceeds the MaxLen of every pipeline")
    return owner
