"""Stage 1 of the two-stage assignment: sequences -> pipelines of one strategy (Hydraulis §6.2, Eq. 2-3).

Objective: minimise max_j D_j, D_j = W_j + c_j * V_min,j + (PP_j - 1) * (c_j + w_j(l_max,j)) (Hydraulis Eq. 2), where a
sequence may only go to pipelines whose MaxLen >= its length. Pipelines differ in (a, b, c), PP and MaxLen.

Heuristic (default): longest-first list scheduling onto the eligible pipeline with the smallest resulting D (identical
pipelines share a heap, so a step costs O(B K log D) for K pipeline classes), then a local search that moves or swaps
sequences off the bottleneck pipeline while that strictly lowers it. Both are loops written once in kernels.py
(compiled with numba, plain Python without it). The pipelines' loads there are the capacity-aware cost
pipecost.cost1 (min over V of f with V_min = max(ceil(sum l / MaxLen), G)). Exact: tidal.planner.exact.dispatch_milp.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost, check_lengths, group_pipes
from tidal.planner.config import DEFAULT, PlannerConfig
from tidal.planner.pipecost import pipe_coeffs


@dataclass(frozen=True)
class DispatchResult:
    groups: tuple[tuple[int, ...], ...]  # per pipeline, indices into lengths (ascending)
    objective: float  # max_j D_j
    loads: tuple[float, ...]  # D_j per pipeline


class SearchState:
    """One assignment's per-pipeline arrays, as the dispatch's loops (kernels.local_search, pipe_loads) read and update
    them in place: cost coefficients, sums (sum l, sum l^2, count, long documents G), the top-two lengths, and
    the capacity-aware cost per pipeline (`load`, pipecost.cost1). `loops`: kernels.loops() (compiled where numba is
    installed) unless given (kernels.PLAIN: the same source as plain Python)."""

    def __init__(self, pipes: Sequence[PipeCost], lengths: np.ndarray, owner: np.ndarray,
                 loops: SimpleNamespace | None = None, arrays: tuple | None = None, orders: tuple | None = None):
        if loops is None:
            from tidal.planner import kernels

            loops = kernels.loops()
        self.loops = loops
        # `arrays`: pipe_arrays(pipes), when the caller builds several states on the same pipelines
        self.A, self.B, self.C, self.D, self.Q1, self.M, self.R, self.H = pipe_arrays(pipes) if arrays is None \
            else arrays
        self.l = lengths
        self.lf = lengths.astype(np.float64)
        # `orders`: length_orders(lengths), when the caller builds several states on the same lengths (else made by
        # the first local_search)
        self.orders = orders
        self.owner = owner
        n = len(pipes)
        # the sums np.bincount gives (weights added in index order), the top-two lengths np.maximum.at gives, and
        # the longest length's count, in one loop (kernels.state_sums)
        self.S, self.Q, self.N, self.G = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
        self.top1, self.top2, self.cnt1 = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)
        self.load = np.zeros(n)
        loops.state_sums(self.lf, owner, self.H, self.S, self.Q, self.N, self.G, self.top1, self.cnt1, self.top2)
        loops.pipe_loads(self.A, self.B, self.C, self.D, self.Q1, self.M, self.R, self.Q, self.S, self.N, self.top1,
                         self.G, self.load)


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


def length_orders(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documents by ascending and by descending length, ties by index (kernels.local_search's `asc`, `desc`; the
    second is also greedy_owner's longest-first order)."""
    return np.argsort(lengths, kind="stable"), np.argsort(-lengths, kind="stable")


def pipe_arrays(pipes: Sequence[PipeCost]) -> tuple[np.ndarray, ...]:
    """SearchState's per-pipeline arrays: the cost coefficients A, B, C, D, Q1 = PipeCost.q (the one-stage rule rides
    on it), MaxLen M, R = sqrt(Q1 / c) (capped), H = M / 2 (documents longer need a micro-batch of their own)."""
    A, B, C, D = pipe_coeffs(pipes)
    Q1 = np.array([p.q for p in pipes], dtype=np.float64)
    M = np.array([p.max_len for p in pipes], dtype=np.float64)
    R = np.sqrt(Q1 / np.where(C > 0, C, 1e-300)).clip(max=1e150)
    return A, B, C, D, Q1, M, R, M / 2

def local_search(st: SearchState, max_rounds: int, max_docs: int = 16, pairs: bool = False, target: float = 0.0,
                 min_gain: float = 1e-4, deadline: float | None = None) -> bool:
    """Move or swap documents off the bottleneck pipeline while that lowers it by more than `min_gain` (relative):
    st.loops.local_search (kernels.local_search, the one source; its doc lists the moves). Stops at `target`
    (nothing better exists) or at `deadline` (time.perf_counter value), checked every 4 rounds. Returns False when
    cut short by the deadline."""
    chunk = max_rounds if deadline is None else 4
    done = 0
    if st.orders is None and max_rounds > 0:
        st.orders = length_orders(st.l)
    while done < max_rounds:
        if deadline is not None and time.perf_counter() > deadline:
            return False
        n = min(chunk, max_rounds - done)
        if st.loops.local_search(st.l, st.lf, st.owner, st.A, st.B, st.C, st.D, st.Q1, st.M, st.R, st.H, st.S, st.Q,
                                 st.N, st.G, st.top1, st.cnt1, st.top2, st.load, *st.orders, n, max_docs,
                                 pairs, target, min_gain):
            return True
        done += n
    return True


def _result(st: SearchState) -> DispatchResult:
    loads, n_pipes = st.load, st.load.size
    order = np.argsort(st.owner, kind="stable")  # ascending indices within each pipeline
    ends = np.cumsum(np.bincount(st.owner, minlength=n_pipes)).tolist()
    flat = order.tolist()
    groups = tuple(tuple(flat[a:b]) for a, b in zip([0] + ends[:-1], ends))
    return DispatchResult(groups, float(loads.max()) if n_pipes else 0.0, tuple(loads.tolist()))


def check_dispatch(lengths, pipes: Sequence[PipeCost]) -> np.ndarray:
    """A dispatch's checks of its input: the lengths as an int64 array (bounds.check_lengths), at least one pipeline,
    each with pp >= 1, max_len >= 1 and nonnegative coefficients, and no length above every pipeline's MaxLen."""
    l_ = check_lengths(lengths)
    if not pipes:
        raise TidalError("a strategy needs at least one pipeline")
    for p in pipes:
        if p.pp < 1 or p.max_len < 1 or min(p.a, p.b, p.c, p.d) < 0:
            raise TidalError(f"bad pipeline cost {p}: need pp >= 1, max_len >= 1 and nonnegative coefficients")
    top = max(p.max_len for p in pipes)
    if l_.size and int(l_.max()) > top:
        raise TidalError(f"sequence of length {int(l_.max())} exceeds the MaxLen {top} of every pipeline")
    return l_


def evaluate(lengths, pipes: Sequence[PipeCost], groups: Sequence[Sequence[int]]) -> DispatchResult:
    """D_j of a given dispatch (checks that every sequence appears exactly once on an eligible pipeline)."""
    l_ = check_lengths(lengths)
    owner = np.full(l_.size, -1, dtype=np.int64)
    for j, g in enumerate(groups):
        for i in g:
            if owner[i] != -1:
                raise TidalError(f"sequence {i} dispatched twice")
            if l_[i] > pipes[j].max_len:
                raise TidalError(f"sequence {i} of length {l_[i]} exceeds MaxLen {pipes[j].max_len} of pipeline {j}")
            owner[i] = j
    if np.any(owner < 0):
        raise TidalError(f"sequence {int(np.flatnonzero(owner < 0)[0])} was not dispatched")
    return owner_result(l_, pipes, owner)


def _rounds(l_: np.ndarray, pipes: Sequence[PipeCost], max_rounds: int | None) -> tuple[bool, int]:
    """(small, rounds): pair swaps in the local search on small instances (B x D <= 512), and its rounds unless
    `max_rounds`: 20 + D, + B on small instances."""
    small = l_.size * len(pipes) <= 512
    return small, max_rounds if max_rounds is not None else 20 + len(pipes) + (l_.size if small else 0)


def dispatch(lengths, pipes: Sequence[PipeCost], *, exact: bool = False, seed: int = 0,
             max_rounds: int | None = None, restarts: int = 4, target: float = 0.0,
             time_limit: float = 10.0, deadline: float | None = None,
             config: PlannerConfig = DEFAULT, orders: tuple | None = None) -> DispatchResult:
    """Dispatch sequences to pipelines minimising max_j of the capacity-aware pipeline cost (`_cost`): the better of
    dispatch_alternatives' results (the lowest objective, ties to the first). exact=True also solves the MILP (of
    the linear objective D_j, Hydraulis Eq. 2) and keeps the better of the two."""
    first, alts = dispatch_alternatives(lengths, pipes, seed=seed, max_rounds=max_rounds, restarts=restarts,
                                        target=target, deadline=deadline, config=config, orders=orders)
    res = min((first, *alts), key=lambda r: r.objective)
    if exact and any(res.groups):
        from tidal.planner.exact import dispatch_milp

        l_ = check_lengths(lengths)
        ex = dispatch_milp(l_, pipes, time_limit=time_limit)
        if ex is not None:
            ex_res = evaluate(l_, pipes, ex)
            if ex_res.objective < res.objective:
                return ex_res
    return res


def dispatch_alternatives(lengths, pipes: Sequence[PipeCost], *, seed: int = 0, max_rounds: int | None = None,
                          restarts: int = 4, target: float = 0.0, deadline: float | None = None,
                          scan: bool = True, config: PlannerConfig = DEFAULT,
                          orders: tuple | None = None) -> tuple[DispatchResult, tuple[DispatchResult, ...]]:
    """The greedy dispatch and its local search, and alternatives, each only if its objective is lower: the best of
    `restarts` seeded random-order restarts, each followed by the same local search, on small instances (B x D <=
    config.restart_max, decision 64), and the jump-scan greedy below.
    The objective is a lower bound on the packed time, not the packed time, so the caller packs both (select.assign).
    Deterministic for a given `seed` (used only by the restarts). The local search stops early once the objective is
    <= `target` (e.g. a lower bound: nothing better is possible), and at `deadline` (a time.perf_counter value: the
    greedy dispatch always completes, so the result is always valid). `scan`: when the first dispatch's bottleneck is
    set by its longest document (_lumpy), also the greedy with its jump scan (greedy_owner), an alternative when its
    objective is below the first's (then after the same local search). `orders`: length_orders(lengths), when the
    caller has them."""
    l_ = check_dispatch(lengths, pipes)
    if l_.size == 0:
        return DispatchResult(tuple(() for _ in pipes), 0.0, tuple(0.0 for _ in pipes)), ()
    small, rounds = _rounds(l_, pipes, max_rounds)
    prep = greedy_prep(pipes)
    arrays = pipe_arrays(pipes)
    orders = length_orders(l_) if orders is None else orders
    st = SearchState(pipes, l_, greedy_owner(l_, pipes, orders[1], prep=prep, scan=False), arrays=arrays,
                     orders=orders)
    done = local_search(st, rounds, pairs=small, target=target, deadline=deadline)
    first = float(st.load.max())
    alts: list[DispatchResult] = []
    if l_.size * len(pipes) <= config.restart_max and restarts and done and first > target:
        # Small instances: a few seeded random-order restarts (they escape LPT's worst cases and the local search's
        # local optima).
        best = restart_dispatch(l_, pipes, restarts, seed=seed, max_rounds=rounds, below=first, target=target,
                                deadline=deadline, prep=prep, arrays=arrays, orders=orders)
        alts = [best] if best is not None else []
    if scan and done and first > target and _lumpy(st):
        # the bottleneck costs V (c + w_max): its longest document, not its work, sets it (decision 63)
        sc = SearchState(pipes, l_, greedy_owner(l_, pipes, orders[1], prep=prep, scan=True), arrays=arrays,
                         orders=orders)
        if float(sc.load.max()) < first:  # the scan greedy alone beats the first's local optimum: search from it
            local_search(sc, rounds, pairs=small, target=target, deadline=deadline)
            return _result(st), (*alts, _result(sc))
    return _result(st), tuple(alts)


def _lumpy(st: SearchState) -> bool:
    """The bottleneck pipeline needs >= 2 micro-batches and its longest document outweighs its mean micro-batch:
    its cost is (PP - 1 + V)(c + w_max), which the greedy's jump scan can avoid."""
    j = int(np.argmax(st.load))
    vmin = max(1.0, math.ceil(st.S[j] / st.M[j]), st.G[j])
    W = st.A[j] * st.Q[j] + st.B[j] * st.S[j] + st.D[j] * st.N[j]
    wm = st.A[j] * st.top1[j] ** 2 + st.B[j] * st.top1[j] + st.D[j]
    return vmin >= 2 and wm * vmin > W * (1 + 1e-9)


def restart_dispatch(lengths: np.ndarray, pipes: Sequence[PipeCost], restarts: int, *, seed: int = 0,
                     max_rounds: int | None = None, below: float = float("inf"), target: float = 0.0,
                     deadline: float | None = None, prep: tuple | None = None, arrays: tuple | None = None,
                     orders: tuple | None = None) -> DispatchResult | None:
    """The best of `restarts` seeded random-order greedy dispatches, each followed by the local search (`max_rounds`,
    default as dispatch_alternatives), or None if none has an objective below `below` (ties: the earlier restart).
    Stops at the first whose objective is <= `target` or when `deadline` passes. `prep`, `arrays`, `orders`:
    greedy_prep(pipes), pipe_arrays(pipes), length_orders(lengths), when the caller has them."""
    l_ = lengths
    small, rounds = _rounds(l_, pipes, max_rounds)
    prep = greedy_prep(pipes) if prep is None else prep
    arrays = pipe_arrays(pipes) if arrays is None else arrays
    orders = length_orders(l_) if orders is None else orders
    rng = np.random.default_rng(seed)
    best: tuple[float, SearchState] | None = None
    for _ in range(restarts):
        cand = SearchState(pipes, l_, greedy_owner(l_, pipes, rng.permutation(l_.size), prep=prep, scan=False),
                           arrays=arrays, orders=orders)
        done = local_search(cand, rounds, pairs=small, target=target, deadline=deadline)
        obj = float(cand.load.max())
        if obj < below and (best is None or obj < best[0]):
            best = (obj, cand)
        if not done or (best is not None and best[0] <= target):
            break
    return None if best is None else _result(best[1])


def owner_result(lengths: np.ndarray, pipes: Sequence[PipeCost], owner: np.ndarray, rounds: int = 0, *,
                 deadline: float | None = None) -> DispatchResult:
    """The DispatchResult (groups, D_j) of the assignment `owner` (an eligible pipeline index per document, every one
    set; unchecked: see `evaluate`) after `rounds` rounds of the dispatch's local search (moves and swaps off the
    bottleneck, no pair swaps; fill.fill_dispatch's finish), or until `deadline`."""
    st = SearchState(pipes, lengths, owner)
    local_search(st, rounds, deadline=deadline)
    return _result(st)
