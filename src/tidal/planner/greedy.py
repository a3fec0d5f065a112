"""The dispatch's greedy start (list scheduling, longest first) with its jump scan, in Python; `kernels.greedy` is
the compiled loop that makes the same choices. `dispatch.py` uses `greedy_owner` and `greedy_prep`."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost, group_pipes
from tidal.planner.pipecost import add_cost


def greedy_prep(pipes: Sequence[PipeCost]) -> tuple:
    """What greedy_owner needs of the pipelines alone: classes of identical pipelines, their members (ascending), and
    the compiled loop's arrays of them. Computed once per dispatch, shared by its restarts."""
    classes, _ = group_pipes(pipes)
    members: list[list[int]] = [[] for _ in classes]
    cls_of = {p: k for k, p in enumerate(classes)}
    for j, p in enumerate(pipes):
        members[cls_of[p]].append(j)
    mcount = np.array([len(m) for m in members], dtype=np.int64)
    arrays = (np.array([p.a for p in classes]), np.array([p.b for p in classes]), np.array([p.c for p in classes]),
              np.array([p.d for p in classes]),
              np.array([p.q for p in classes], dtype=np.float64),
              np.array([p.max_len for p in classes], dtype=np.int64),
              np.array([j for m in members for j in m], dtype=np.int64),
              np.concatenate([[0], np.cumsum(mcount)[:-1]]).astype(np.int64), mcount,
              np.array([p.max_len for p in pipes], dtype=np.int64))
    return classes, members, arrays


def greedy_owner(lengths: np.ndarray, pipes: Sequence[PipeCost], order: np.ndarray | None = None,
            compiled: bool = True, prep: tuple | None = None, scan: bool = True) -> np.ndarray:
    """List scheduling: each sequence (longest first unless `order`) to the eligible pipeline with the least resulting
    cost. Per class of identical pipelines two are tried: the first empty one and the least-loaded used one, or every
    used one (`scan`, decision 63) when adding to the least-loaded one costs more than the sequence's work plus one
    micro-batch constant (a PP = 1 pipeline over its MaxLen with a long document jumps to 2 (c + w(l_max)); a fuller
    pipeline with room is then cheaper).
    Runs the compiled loop (kernels.greedy, same choices) when numba is there and `compiled`. `prep`:
    greedy_prep(pipes), when the caller has it."""
    from tidal.planner import kernels

    classes, members, arrays = greedy_prep(pipes) if prep is None else prep
    if order is None:
        order = np.argsort(-lengths, kind="stable")
    if compiled and kernels.AVAILABLE:
        owner, bad = kernels.greedy(lengths.astype(np.int64), order.astype(np.int64), *arrays, scan)
        if bad >= 0:
            raise TidalError(f"sequence of length {int(lengths[bad])} exceeds the MaxLen of every pipeline")
        return owner
    empty = [list(reversed(m)) for m in members]  # pop() yields the lowest index first
    heaps: list[list[tuple[float, int]]] = [[] for _ in classes]
    W = [0.0] * len(pipes)
    T = [0] * len(pipes)
    L = [0.0] * len(pipes)
    U = [0] * len(pipes)
    G = [0] * len(pipes)
    owner = np.empty(lengths.size, dtype=np.int64)
    cls = [(k, p.a, p.b, p.c, p.d, p.q, p.max_len) for k, p in enumerate(classes)]
    for i in order.tolist():
        x = int(lengths[i])
        best_key, best_k = None, -1
        wbest = 0.0
        for k, a, b, c, d, q, M in cls:
            if x > M:
                continue
            wx = a * x * x + b * x + d
            h = heaps[k]
            if h:
                j = h[0][1]
                big = 2 * x > M
                v = add_cost(c, q, M, W[j], T[j], L[j], U[j], G[j], x, wx, big)
                if scan and v > (h[0][0] + wx + c) * (1 + 1e-9):
                    # on the least-loaded pipeline x would cost more than its work and one micro-batch (a V_min jump
                    # with a long document: (V + 1)(c + w_max)): try every used pipeline of the class
                    for _, jj in h[1:]:
                        vv = add_cost(c, q, M, W[jj], T[jj], L[jj], U[jj], G[jj], x, wx, big)
                        if (vv, jj) < (v, j):
                            v, j = vv, jj
                if best_key is None or (v, j) < best_key:
                    best_key, best_k, wbest = (v, j), k, wx
            e = empty[k]
            if e:
                j = e[-1]
                v = (q + 1) * (c + wx)
                if best_key is None or (v, j) < best_key:
                    best_key, best_k, wbest = (v, j), k, wx
        if best_key is None:
            raise TidalError(f"sequence of length {x} exceeds the MaxLen of every pipeline")
        newd, j = best_key
        if T[j] == 0:
            empty[best_k].pop()
            heapq.heappush(heaps[best_k], (newd, j))
        elif heaps[best_k][0][1] == j:
            heapq.heapreplace(heaps[best_k], (newd, j))
        else:  # a jump scan chose a pipeline below the top: its key grows, restore the heap
            h = heaps[best_k]
            h[next(p for p, e in enumerate(h) if e[1] == j)] = (newd, j)
            heapq.heapify(h)
        W[j] += wbest
        T[j] += x
        U[j] += 1
        G[j] += 2 * x > pipes[j].max_len
        if wbest > L[j]:
            L[j] = wbest
        owner[i] = j
    return owner
