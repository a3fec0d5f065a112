"""Stage 1 of the two-stage assignment: sequences -> pipelines of one strategy (Hydraulis §6.2, Eq. 2-3).

Objective: minimise max_j D_j, D_j = W_j + c_j * V_min,j + (PP_j - 1) * (c_j + w_j(l_max,j)) (bounds.eq2_bound), where a
sequence may only go to pipelines whose MaxLen >= its length. Pipelines differ in (a, b, c), PP and MaxLen.

Heuristic (default): longest-first list scheduling onto the eligible pipeline with the smallest resulting D (identical
pipelines share a heap, so a step costs O(B K log D) for K pipeline classes), then a vectorised local search that moves
or swaps sequences off the bottleneck pipeline while that strictly lowers it. Exact: tidal.planner.exact.dispatch_milp.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost, check_lengths
from tidal.planner.config import DEFAULT, PlannerConfig
from tidal.planner.greedy import greedy_owner, greedy_prep


@dataclass(frozen=True)
class DispatchResult:
    groups: tuple[tuple[int, ...], ...]  # per pipeline, indices into lengths (ascending)
    objective: float  # max_j D_j
    loads: tuple[float, ...]  # D_j per pipeline


def _cost(A, B, C, Q1, M, Q, S, N, lmax, G, R, Dd) -> np.ndarray:
    """Capacity-aware pipeline cost (vectorised pipecost.cost1): min over integer V in [V_min, U] of (PP - 1 + V) *
    max(c + W / V, c + w(l_max)) (V (W / V + c) = V c + W when PP = 1: one stage sums its micro-batches) with W = a *
    sum l^2 + b * sum l + d * U, U the count and V_min = max(ceil(sum l / MaxLen), G), G the number of documents
    longer than MaxLen / 2 (no two share a micro-batch); 0 when empty. A lower bound on the packed time
    (bounds.pipeline_bound with the G term) that charges the micro-batches MaxLen forces: a PP = 1 pipeline over its
    MaxLen costs >= W + 2c, not W + c. The function of V is convex with continuous minimiser min(sqrt((PP - 1) W /
    c), W / w(l_max)) (docs/planner.md), so only its floor and ceiling (clipped) are evaluated. R = sqrt((PP - 1) /
    c) per pipeline (a huge finite number when c = 0 < PP - 1)."""
    W = A * Q + B * S + Dd * N
    wm = A * lmax * lmax + B * lmax + Dd
    vmin = np.maximum(np.maximum(1.0, np.ceil(S / M)), G)
    vmax = np.maximum(vmin, N)
    v0 = np.minimum(np.sqrt(W) * R, W / np.maximum(wm, 1e-300))
    lo = np.minimum(np.maximum(np.floor(v0), vmin), vmax)
    hi = np.minimum(np.maximum(np.ceil(v0), vmin), vmax)
    cw = C + np.where(Q1 > 0, wm, 0.0)  # pipecost.pipe_value: one stage sums its micro-batches (decision 94)
    f = np.minimum((Q1 + lo) * np.maximum(W / lo + C, cw), (Q1 + hi) * np.maximum(W / hi + C, cw))
    return np.where(N > 0, f, 0.0)


class _State:
    """Per-pipeline sums (sum l, sum l^2, count, top-two lengths) and costs, updated in O(1) per move (plus an O(B)
    scan of the two pipelines' top lengths); hypothetical moves are evaluated vectorised with `_cost`."""

    def __init__(self, pipes: Sequence[PipeCost], lengths: np.ndarray, owner: np.ndarray):
        self.A = np.array([p.a for p in pipes])
        self.B = np.array([p.b for p in pipes])
        self.C = np.array([p.c for p in pipes])
        self.D = np.array([p.d for p in pipes])
        self.Q1 = np.array([p.q for p in pipes], dtype=np.float64)  # PipeCost.q: the one-stage rule rides on it
        self.M = np.array([p.max_len for p in pipes], dtype=np.float64)
        self.R = np.sqrt(self.Q1 / np.where(self.C > 0, self.C, 1e-300)).clip(max=1e150)
        self.l = lengths
        self.lf = lengths.astype(np.float64)
        self.owner = owner
        n = len(pipes)
        self.S = np.bincount(owner, weights=self.lf, minlength=n)
        self.Q = np.bincount(owner, weights=self.lf * self.lf, minlength=n)
        self.N = np.bincount(owner, minlength=n).astype(np.float64)
        self.H = self.M / 2  # documents longer than this need a micro-batch of their own
        self.G = np.bincount(owner, weights=(self.lf > self.H[owner]).astype(np.float64), minlength=n)
        self.top1 = np.zeros(n)
        np.maximum.at(self.top1, owner, self.lf)
        is_top = self.lf == self.top1[owner]
        self.cnt1 = np.bincount(owner[is_top], minlength=n).astype(np.int64)
        self.top2 = np.zeros(n)
        np.maximum.at(self.top2, owner[~is_top], self.lf[~is_top])
        self.load = self.value(slice(None), self.Q, self.S, self.N, self.top1, self.G)

    def _refresh(self, j: int) -> None:
        v = self.lf[self.owner == j]
        if v.size == 0:
            self.top1[j] = self.top2[j] = 0.0
            self.cnt1[j] = 0
        else:
            m = v.max()
            self.top1[j] = m
            self.cnt1[j] = int(np.count_nonzero(v == m))
            rest = v[v < m]
            self.top2[j] = rest.max() if rest.size else 0.0
        self.load[j] = self.value(j, self.Q[j], self.S[j], self.N[j], self.top1[j], self.G[j])

    def value(self, idx, Q, S, N, lmax, G) -> np.ndarray:
        return _cost(self.A[idx], self.B[idx], self.C[idx], self.Q1[idx], self.M[idx], Q, S, N, lmax, G, self.R[idx],
                     self.D[idx])

    def lmax_without(self, j, length):
        """l_max of pipeline(s) j after removing one document of `length` (vectorised)."""
        return np.where((length == self.top1[j]) & (self.cnt1[j] == 1), self.top2[j], self.top1[j])

    def move(self, i: int, k: int) -> None:
        j = int(self.owner[i])
        x = self.lf[i]
        self.S[j] -= x
        self.Q[j] -= x * x
        self.N[j] -= 1
        self.G[j] -= x > self.H[j]
        self.G[k] += x > self.H[k]
        self.S[k] += x
        self.Q[k] += x * x
        self.N[k] += 1
        self.owner[i] = k
        self._refresh(j)
        self._refresh(k)


def _local_search(st: _State, max_rounds: int, max_docs: int = 16, pairs: bool = False, target: float = 0.0,
                  min_gain: float = 1e-4, deadline: float | None = None, compiled: bool = True) -> bool:
    """Move or swap documents off the bottleneck pipeline while that lowers it by more than `min_gain` (relative);
    all candidate moves of one round are evaluated in one vectorised pass. Stops at `target` (nothing better exists)
    or at `deadline` (time.perf_counter value). Returns False when cut short by the deadline. Runs the compiled
    rounds (kernels.local_search, same moves) when numba is there and `compiled`; with a deadline they run in chunks
    of 4 rounds, the deadline checked between chunks."""
    from tidal.planner import kernels

    if compiled and kernels.AVAILABLE:
        chunk = max_rounds if deadline is None else 4
        done = 0
        while done < max_rounds:
            if deadline is not None and time.perf_counter() > deadline:
                return False
            n = min(chunk, max_rounds - done)
            if kernels.local_search(st.l, st.lf, st.owner, st.A, st.B, st.C, st.D, st.Q1, st.M, st.R, st.H, st.S, st.Q,
                                    st.N, st.G, st.top1, st.cnt1, st.top2, st.load, n, max_docs, pairs, target,
                                    min_gain):
                return True
            done += n
        return True
    n_p = len(st.S)
    all_p = np.arange(n_p)
    for _ in range(max_rounds):
        if deadline is not None and time.perf_counter() > deadline:
            return False
        j = int(np.argmax(st.load))
        dmax = st.load[j]
        if dmax <= target or dmax <= 0:
            return True
        mine = np.flatnonzero(st.owner == j)
        ml = st.l[mine]
        uniq, first = np.unique(ml, return_index=True)
        sel = mine[first[::-1][:max_docs]]  # one document per distinct length, longest first
        xs = st.lf[sel]
        x2 = xs * xs
        lj = st.lmax_without(j, xs)
        best_val, best_act = dmax * (1 - min_gain), None
        # move one document of j to any other eligible pipeline: |xs| x P
        new_j = st.value(j, st.Q[j] - x2, st.S[j] - xs, st.N[j] - 1, lj, st.G[j] - (xs > st.H[j]))
        new_k = _cost(st.A, st.B, st.C, st.Q1, st.M, st.Q[None, :] + x2[:, None], st.S[None, :] + xs[:, None],
                      st.N[None, :] + 1, np.maximum(st.top1[None, :], xs[:, None]),
                      st.G[None, :] + (xs[:, None] > st.H[None, :]), st.R, st.D)
        val = np.where((all_p[None, :] != j) & (xs[:, None] <= st.M[None, :]), np.maximum(new_j[:, None], new_k),
                       np.inf)
        m = int(np.argmin(val))
        if val.flat[m] < best_val:
            u, k = divmod(m, n_p)
            best_val, best_act = float(val.flat[m]), (int(sel[u]), k, -1)
        if st.l.size > 256 and n_p > 8:
            # Large steps: swap partners only from the 8 least-loaded pipelines (where a bottleneck's work can go).
            light = np.argsort(st.load, kind="stable")[:8]  # ties by index
            e_idx = np.flatnonzero(np.isin(st.owner, light[light != j]))
        else:
            e_idx = np.flatnonzero(st.owner != j)
        if e_idx.size:
            # swap a document of j with a document e of another pipeline: |xs| x E
            le = st.lf[e_idx][None, :]
            ke = st.owner[e_idx]
            hk = st.H[ke][None, :]
            nj = st.value(j, st.Q[j] - x2[:, None] + le * le, st.S[j] - xs[:, None] + le, st.N[j],
                          np.maximum(lj[:, None], le), st.G[j] - (xs[:, None] > st.H[j]) + (le > st.H[j]))
            lk = st.lmax_without(ke, le[0])[None, :]
            nk = _cost(st.A[ke], st.B[ke], st.C[ke], st.Q1[ke], st.M[ke], st.Q[ke] - le * le + x2[:, None],
                       st.S[ke] - le + xs[:, None], st.N[ke], np.maximum(lk, xs[:, None]),
                       st.G[ke] - (le > hk) + (xs[:, None] > hk), st.R[ke], st.D[ke])
            ok = (le <= st.M[j]) & (xs[:, None] <= st.M[ke][None, :]) & (le != xs[:, None])
            val = np.where(ok, np.maximum(nj, nk), np.inf)
            m = int(np.argmin(val))
            if val.flat[m] < best_val:
                u, e = divmod(m, e_idx.size)
                best_val, best_act = float(val.flat[m]), (int(sel[u]), int(ke[e]), int(e_idx[e]))
            if best_act is None and pairs and 2 <= mine.size <= 24:
                best_val, best_act = _pair_swap(st, j, mine, e_idx, best_val)
        if best_act is None:
            return True
        i, k, e = best_act[:3]
        st.move(i, k)
        if e >= 0:
            st.move(e, j)
        if len(best_act) > 3:
            st.move(best_act[3], k)
    return True


def _pair_swap(st: _State, j: int, mine: np.ndarray, e_idx: np.ndarray, best_val: float):
    """Two documents of the bottleneck pipeline j for one document of another pipeline (all pairs vectorised)."""
    order = mine[np.argsort(-st.lf[mine], kind="stable")]
    ls = st.lf[order]
    u, v = np.triu_indices(order.size, 1)
    # l_max of j without sorted positions u < v: the first position not in {u, v}
    rest = np.where(u > 0, ls[0], np.where(v > 1, ls[1] if ls.size > 1 else 0.0, ls[2] if ls.size > 2 else 0.0))
    x1, x2 = ls[u][:, None], ls[v][:, None]
    q, s = x1 * x1 + x2 * x2, x1 + x2
    le = st.lf[e_idx][None, :]
    ke = st.owner[e_idx]
    hj, hk = st.H[j], st.H[ke][None, :]
    nj = st.value(j, st.Q[j] - q + le * le, st.S[j] - s + le, st.N[j] - 1, np.maximum(rest[:, None], le),
                  st.G[j] - (x1 > hj) - (x2 > hj) + (le > hj))
    lk = st.lmax_without(ke, le[0])[None, :]
    nk = _cost(st.A[ke], st.B[ke], st.C[ke], st.Q1[ke], st.M[ke], st.Q[ke] - le * le + q, st.S[ke] - le + s,
               st.N[ke] + 1, np.maximum(lk, np.maximum(x1, x2)), st.G[ke] - (le > hk) + (x1 > hk) + (x2 > hk),
               st.R[ke], st.D[ke])
    ok = (le <= st.M[j]) & (np.maximum(x1, x2) <= st.M[ke][None, :])
    val = np.where(ok, np.maximum(nj, nk), np.inf)
    m = int(np.argmin(val))
    if val.flat[m] < best_val:
        p, e = divmod(m, e_idx.size)
        return float(val.flat[m]), (int(order[u[p]]), int(ke[e]), int(e_idx[e]), int(order[v[p]]))
    return best_val, None


def _result(st: _State, n_pipes: int) -> DispatchResult:
    loads = st.load
    order = np.argsort(st.owner, kind="stable")  # ascending indices within each pipeline
    ends = np.cumsum(np.bincount(st.owner, minlength=n_pipes)).tolist()
    flat = order.tolist()
    groups = tuple(tuple(flat[a:b]) for a, b in zip([0] + ends[:-1], ends))
    return DispatchResult(groups, float(loads.max()) if n_pipes else 0.0, tuple(float(x) for x in loads))


def check_pipes(pipes: Sequence[PipeCost]) -> None:
    if not pipes:
        raise TidalError("a strategy needs at least one pipeline")
    for p in pipes:
        if p.pp < 1 or p.max_len < 1 or min(p.a, p.b, p.c, p.d) < 0:
            raise TidalError(f"bad pipeline cost {p}: need pp >= 1, max_len >= 1 and nonnegative coefficients")


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
    return _result(_State(pipes, l_, owner), len(pipes))


def dispatch(lengths, pipes: Sequence[PipeCost], *, exact: bool = False, seed: int = 0,
             max_rounds: int | None = None, restarts: int = 4, target: float = 0.0,
             time_limit: float = 10.0, deadline: float | None = None,
             config: PlannerConfig = DEFAULT) -> DispatchResult:
    """Dispatch sequences to pipelines minimising max_j of the capacity-aware pipeline cost (`_cost`): the better of
    dispatch_alternatives' results (the lowest objective, ties to the first). exact=True also solves the MILP (of
    the linear objective D_j, bounds.eq2_bound) and keeps the better of the two."""
    first, alts = dispatch_alternatives(lengths, pipes, seed=seed, max_rounds=max_rounds, restarts=restarts,
                                        target=target, deadline=deadline, config=config)
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
                          scan: bool = True, extra: list[DispatchResult] | None = None,
                          config: PlannerConfig = DEFAULT) -> tuple[DispatchResult, tuple[DispatchResult, ...]]:
    """The greedy dispatch and its local search, and alternatives, each only if its objective is lower: the best of
    `restarts` seeded random-order restarts, each followed by the same local search, on small instances (B x D <=
    config.restart_max, decision 64), and the jump-scan greedy below.
    The objective is a lower bound on the packed time, not the packed time, so the caller packs both (select.assign).
    Deterministic for a given `seed` (used only by the restarts). The local search stops early once the objective is
    <= `target` (e.g. a lower bound: nothing better is possible), and at `deadline` (a time.perf_counter value: the
    greedy dispatch always completes, so the result is always valid). `scan`: when the first dispatch's bottleneck is
    set by its longest document (_lumpy), also the greedy with its jump scan (greedy_owner), an alternative when its
    objective is below the first's (then after the same local search). `extra`, when given, receives the next-best
    restarts (up to config.restart_keep - 1, best first), which are not in the alternatives: select.assign packs them
    last, so what it did with the alternatives is unchanged (decision 64)."""
    l_ = check_lengths(lengths)
    check_pipes(pipes)
    top = max(p.max_len for p in pipes)
    if l_.size and int(l_.max()) > top:
        raise TidalError(f"sequence of length {int(l_.max())} exceeds the MaxLen {top} of every pipeline")
    if l_.size == 0:
        return DispatchResult(tuple(() for _ in pipes), 0.0, tuple(0.0 for _ in pipes)), ()
    small = l_.size * len(pipes) <= 512
    rounds = max_rounds if max_rounds is not None else 20 + len(pipes) + (l_.size if small else 0)
    prep = greedy_prep(pipes)
    st = _State(pipes, l_, greedy_owner(l_, pipes, prep=prep, scan=False))
    done = _local_search(st, rounds, pairs=small, target=target, deadline=deadline)
    first = float(st.load.max())
    alts: list[DispatchResult] = []
    if l_.size * len(pipes) <= config.restart_max and restarts and done and first > target:
        # Small instances: a few seeded random-order restarts (they escape LPT's worst cases and the local search's
        # local optima).
        found = restart_dispatches(l_, pipes, restarts, keep=1 if extra is None else config.restart_keep, seed=seed,
                                   max_rounds=rounds, below=first, target=target, deadline=deadline, prep=prep)
        alts = found[:1]
        if extra is not None:
            extra.extend(found[1:])
    if scan and done and first > target and _lumpy(st):
        # the bottleneck costs V (c + w_max): its longest document, not its work, sets it (decision 63)
        sc = _State(pipes, l_, greedy_owner(l_, pipes, prep=prep, scan=True))
        if float(sc.load.max()) < first:  # the scan greedy alone beats the first's local optimum: search from it
            _local_search(sc, rounds, pairs=small, target=target, deadline=deadline)
            return _result(st, len(pipes)), (*alts, _result(sc, len(pipes)))
    return _result(st, len(pipes)), tuple(alts)


def _lumpy(st: _State) -> bool:
    """The bottleneck pipeline needs >= 2 micro-batches and its longest document outweighs its mean micro-batch:
    its cost is (PP - 1 + V)(c + w_max), which the greedy's jump scan can avoid."""
    j = int(np.argmax(st.load))
    vmin = max(1.0, math.ceil(st.S[j] / st.M[j]), st.G[j])
    W = st.A[j] * st.Q[j] + st.B[j] * st.S[j] + st.D[j] * st.N[j]
    wm = st.A[j] * st.top1[j] ** 2 + st.B[j] * st.top1[j] + st.D[j]
    return vmin >= 2 and wm * vmin > W * (1 + 1e-9)


def restart_dispatch(lengths: np.ndarray, pipes: Sequence[PipeCost], restarts: int, *, seed: int = 0,
                     max_rounds: int | None = None, below: float = float("inf"), target: float = 0.0,
                     deadline: float | None = None, prep: tuple | None = None,
                     scan: bool = False) -> DispatchResult | None:
    """The best of `restarts` seeded random-order greedy dispatches, each followed by the local search (`max_rounds`,
    default as dispatch_alternatives), or None if none has an objective below `below`. Stops at the first whose
    objective is <= `target` or when `deadline` passes."""
    found = restart_dispatches(lengths, pipes, restarts, keep=1, seed=seed, max_rounds=max_rounds, below=below,
                               target=target, deadline=deadline, prep=prep, scan=scan)
    return found[0] if found else None


def restart_dispatches(lengths: np.ndarray, pipes: Sequence[PipeCost], restarts: int, *, keep: int, seed: int = 0,
                       max_rounds: int | None = None, below: float = float("inf"), target: float = 0.0,
                       deadline: float | None = None, prep: tuple | None = None,
                       scan: bool = False) -> list[DispatchResult]:
    """restart_dispatch's restarts, the `keep` best with objectives below `below`, best first (ties: earlier restart
    first). The objective only bounds the packed time, so a caller that packs may want more than the best
    (decision 64)."""
    l_ = lengths
    small = l_.size * len(pipes) <= 512
    rounds = max_rounds if max_rounds is not None else 20 + len(pipes) + (l_.size if small else 0)
    prep = greedy_prep(pipes) if prep is None else prep
    rng = np.random.default_rng(seed)
    found: list[tuple[float, int, _State]] = []
    for r in range(restarts):
        cand = _State(pipes, l_, greedy_owner(l_, pipes, rng.permutation(l_.size), prep=prep, scan=scan))
        done = _local_search(cand, rounds, pairs=small, target=target, deadline=deadline)
        obj = float(cand.load.max())
        if obj < below:
            found = sorted(found + [(obj, r, cand)], key=lambda z: (z[0], z[1]))[:keep]
        if not done or (found and found[0][0] <= target):
            break
    return [_result(st, len(pipes)) for _, _, st in found]


def search_from(lengths: np.ndarray, pipes: Sequence[PipeCost], owner: np.ndarray, rounds: int, *,
                deadline: float | None = None) -> DispatchResult:
    """The dispatch's local search (moves and swaps off the bottleneck, no pair swaps) from the assignment `owner`
    (a pipeline index per document, every one set), for `rounds` rounds or until `deadline`: fill.fill_dispatch's
    finish."""
    st = _State(pipes, lengths, owner)
    _local_search(st, rounds, deadline=deadline)
    return _result(st, len(pipes))


def owner_result(lengths: np.ndarray, pipes: Sequence[PipeCost], owner: np.ndarray) -> DispatchResult:
    """The DispatchResult (groups, D_j) of the assignment `owner` (an eligible pipeline index per document, every one
    set; unchecked: see `evaluate`)."""
    return _result(_State(pipes, lengths, owner), len(pipes))
