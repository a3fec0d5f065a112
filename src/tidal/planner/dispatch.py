"""Stage 1 of the two-stage assignment: sequences -> pipelines of one strategy (Hydraulis §6.2, Eq. 2-3).

Objective: minimise max_j D_j, D_j = W_j + c_j * V_min,j + (PP_j - 1) * (c_j + w_j(l_max,j)) (bounds.eq2_bound), where a
sequence may only go to pipelines whose MaxLen >= its length. Pipelines differ in (a, b, c), PP and MaxLen.

Heuristic (default): longest-first list scheduling onto the eligible pipeline with the smallest resulting D (identical
pipelines share a heap, so a step costs O(B K log D) for K pipeline classes), then a vectorised local search that moves
or swaps sequences off the bottleneck pipeline while that strictly lowers it. Exact: tidal.planner.exact.dispatch_milp.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost, check_lengths, group_pipes


@dataclass(frozen=True)
class DispatchResult:
    groups: tuple[tuple[int, ...], ...]  # per pipeline, indices into lengths (ascending)
    objective: float  # max_j D_j
    loads: tuple[float, ...]  # D_j per pipeline


class _State:
    """Per-pipeline sums with vectorised evaluation of D for hypothetical changes."""

    def __init__(self, pipes: Sequence[PipeCost], lengths: np.ndarray, owner: np.ndarray):
        self.A = np.array([p.a for p in pipes])
        self.B = np.array([p.b for p in pipes])
        self.C = np.array([p.c for p in pipes])
        self.Q1 = np.array([p.pp - 1 for p in pipes], dtype=np.float64)
        self.M = np.array([p.max_len for p in pipes], dtype=np.int64)
        self.l = lengths
        self.lf = lengths.astype(np.float64)
        self.owner = owner
        n = len(pipes)
        self.S = np.bincount(owner, weights=self.lf, minlength=n)
        self.Q = np.bincount(owner, weights=self.lf * self.lf, minlength=n)
        self.N = np.bincount(owner, minlength=n)
        self.top1 = np.zeros(n)
        np.maximum.at(self.top1, owner, self.lf)
        is_top = self.lf == self.top1[owner]
        self.cnt1 = np.bincount(owner[is_top], minlength=n).astype(np.int64)
        self.top2 = np.zeros(n)
        np.maximum.at(self.top2, owner[~is_top], self.lf[~is_top])

    def _refresh(self, j: int) -> None:
        v = self.lf[self.owner == j]
        if v.size == 0:
            self.top1[j] = self.top2[j] = 0.0
            self.cnt1[j] = 0
            return
        m = v.max()
        self.top1[j] = m
        self.cnt1[j] = int(np.count_nonzero(v == m))
        rest = v[v < m]
        self.top2[j] = rest.max() if rest.size else 0.0

    def value(self, idx, Q, S, N, lmax) -> np.ndarray:
        A, B, C, Q1, M = self.A[idx], self.B[idx], self.C[idx], self.Q1[idx], self.M[idx]
        vmin = np.maximum(1.0, np.ceil(S / M))
        d = A * Q + B * S + C * vmin + Q1 * (C + A * lmax * lmax + B * lmax)
        return np.where(N > 0, d, 0.0)

    def loads(self) -> np.ndarray:
        idx = np.arange(len(self.S))
        return self.value(idx, self.Q, self.S, self.N, self.top1)

    def lmax_without(self, j, length):
        """l_max of pipeline(s) j after removing one document of `length` (vectorised)."""
        return np.where((length == self.top1[j]) & (self.cnt1[j] == 1), self.top2[j], self.top1[j])

    def move(self, i: int, k: int) -> None:
        j = int(self.owner[i])
        x = self.lf[i]
        self.S[j] -= x
        self.Q[j] -= x * x
        self.N[j] -= 1
        self.S[k] += x
        self.Q[k] += x * x
        self.N[k] += 1
        self.owner[i] = k
        self._refresh(j)
        self._refresh(k)


def _greedy(lengths: np.ndarray, pipes: Sequence[PipeCost], order: np.ndarray | None = None) -> np.ndarray:
    """List scheduling: each sequence (longest first unless `order`) to the eligible pipeline with the least resulting
    D_j. Per class of identical pipelines only two can be best: the first empty one and the least-loaded used one."""
    classes, _ = group_pipes(pipes)
    members: list[list[int]] = [[] for _ in classes]
    cls_of = {p: k for k, p in enumerate(classes)}
    for j, p in enumerate(pipes):
        members[cls_of[p]].append(j)
    empty = [list(reversed(m)) for m in members]  # pop() yields the lowest index first
    heaps: list[list[tuple[float, int]]] = [[] for _ in classes]
    W = [0.0] * len(pipes)
    T = [0] * len(pipes)
    L = [0.0] * len(pipes)
    owner = np.empty(lengths.size, dtype=np.int64)
    if order is None:
        order = np.argsort(-lengths, kind="stable")
    cls = [(k, p.a, p.b, p.c, p.pp - 1, p.max_len) for k, p in enumerate(classes)]
    for i in order.tolist():
        x = int(lengths[i])
        best_key, best_k = None, -1
        wbest = 0.0
        for k, a, b, c, q, M in cls:
            if x > M:
                continue
            wx = a * x * x + b * x
            h = heaps[k]
            if h:
                j = h[0][1]
                tok = T[j] + x
                v = W[j] + wx + c * (1 if tok <= M else -(-tok // M)) + q * (c + (L[j] if L[j] > wx else wx))
                if best_key is None or (v, j) < best_key:
                    best_key, best_k, wbest = (v, j), k, wx
            e = empty[k]
            if e:
                j = e[-1]
                v = wx + c + q * (c + wx)
                if best_key is None or (v, j) < best_key:
                    best_key, best_k, wbest = (v, j), k, wx
        if best_key is None:
            raise TidalError(f"sequence of length {x} exceeds the MaxLen of every pipeline")
        newd, j = best_key
        if T[j] == 0:
            empty[best_k].pop()
            heapq.heappush(heaps[best_k], (newd, j))
        else:
            heapq.heapreplace(heaps[best_k], (newd, j))  # j was the heap top
        W[j] += wbest
        T[j] += x
        if wbest > L[j]:
            L[j] = wbest
        owner[i] = j
    return owner


def _local_search(st: _State, max_rounds: int, max_docs: int = 16, pairs: bool = False, target: float = 0.0,
                  min_gain: float = 1e-4) -> None:
    """Stops when no move/swap lowers the bottleneck by more than `min_gain` (relative) or it reaches `target`."""
    n_p = len(st.S)
    all_p = np.arange(n_p)
    for _ in range(max_rounds):
        loads = st.loads()
        j = int(np.argmax(loads))
        dmax = loads[j]
        if dmax <= target or dmax <= 0:
            return
        mine = np.flatnonzero(st.owner == j)
        uniq = np.unique(st.l[mine])[::-1][:max_docs]
        if st.l.size > 256 and n_p > 8:
            # Large steps: swap partners only from the 8 least-loaded pipelines (where a bottleneck's work can go).
            light = np.argpartition(loads, 8)[:8]
            e_idx = np.flatnonzero(np.isin(st.owner, light[light != j]))
        else:
            e_idx = np.flatnonzero(st.owner != j)
        best_val, best_act = dmax * (1 - min_gain), None
        for x in uniq.tolist():
            i = int(mine[np.flatnonzero(st.l[mine] == x)[0]])
            xf = float(x)
            lj = st.lmax_without(j, xf)
            # move i to any other eligible pipeline
            new_j = st.value(j, st.Q[j] - xf * xf, st.S[j] - xf, st.N[j] - 1, lj)
            new_k = st.value(all_p, st.Q + xf * xf, st.S + xf, st.N + 1, np.maximum(st.top1, xf))
            val = np.where((all_p != j) & (x <= st.M), np.maximum(new_j, new_k), np.inf)
            k = int(np.argmin(val))
            if val[k] < best_val:
                best_val, best_act = float(val[k]), (i, k, -1)
            if e_idx.size == 0:
                continue
            # swap i with a document e of another pipeline
            le = st.lf[e_idx]
            ke = st.owner[e_idx]
            nj = st.value(j, st.Q[j] - xf * xf + le * le, st.S[j] - xf + le, st.N[j], np.maximum(lj, le))
            lk = st.lmax_without(ke, le)
            nk = st.value(ke, st.Q[ke] - le * le + xf * xf, st.S[ke] - le + xf, st.N[ke], np.maximum(lk, xf))
            ok = (st.l[e_idx] <= st.M[j]) & (x <= st.M[ke]) & (le != xf)
            val = np.where(ok, np.maximum(nj, nk), np.inf)
            m = int(np.argmin(val))
            if val[m] < best_val:
                best_val, best_act = float(val[m]), (i, int(ke[m]), int(e_idx[m]))
        if best_act is None and pairs and 2 <= mine.size <= 24 and e_idx.size:
            best_val, best_act = _pair_swap(st, j, mine, e_idx, best_val)
        if best_act is None:
            return
        i, k, e = best_act[:3]
        st.move(i, k)
        if e >= 0:
            st.move(e, j)
        if len(best_act) > 3:
            st.move(best_act[3], k)


def _pair_swap(st: _State, j: int, mine: np.ndarray, e_idx: np.ndarray, best_val: float):
    """Two sequences of the bottleneck pipeline j for one sequence of another pipeline."""
    best_act = None
    le = st.lf[e_idx]
    ke = st.owner[e_idx]
    lj_all = st.lf[mine]
    for u in range(mine.size):
        for v in range(u + 1, mine.size):
            x1, x2 = lj_all[u], lj_all[v]
            rest = np.delete(lj_all, [u, v])
            lj = rest.max() if rest.size else 0.0
            q, s = x1 * x1 + x2 * x2, x1 + x2
            nj = st.value(j, st.Q[j] - q + le * le, st.S[j] - s + le, st.N[j] - 1, np.maximum(lj, le))
            lk = st.lmax_without(ke, le)
            nk = st.value(ke, st.Q[ke] - le * le + q, st.S[ke] - le + s, st.N[ke] + 1, np.maximum(lk, max(x1, x2)))
            ok = (st.l[e_idx] <= st.M[j]) & (max(x1, x2) <= st.M[ke])
            val = np.where(ok, np.maximum(nj, nk), np.inf)
            m = int(np.argmin(val))
            if val[m] < best_val:
                best_val, best_act = float(val[m]), (int(mine[u]), int(ke[m]), int(e_idx[m]), int(mine[v]))
    return best_val, best_act


def _result(st: _State, n_pipes: int) -> DispatchResult:
    loads = st.loads()
    groups = tuple(tuple(np.flatnonzero(st.owner == j).tolist()) for j in range(n_pipes))
    return DispatchResult(groups, float(loads.max()) if n_pipes else 0.0, tuple(float(x) for x in loads))


def check_pipes(pipes: Sequence[PipeCost]) -> None:
    if not pipes:
        raise TidalError("a strategy needs at least one pipeline")
    for p in pipes:
        if p.pp < 1 or p.max_len < 1 or min(p.a, p.b, p.c) < 0:
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
             max_rounds: int | None = None, restarts: int = 8, target: float = 0.0,
             time_limit: float = 10.0) -> DispatchResult:
    """Dispatch sequences to pipelines minimising max_j D_j. Deterministic for a given `seed` (used only by the
    `restarts` random-order restarts on small instances, B x D <= 512). The local search stops early once the
    objective is <= `target` (e.g. a lower bound: nothing better is possible). exact=True also solves the MILP and
    keeps the better of the two."""
    l_ = check_lengths(lengths)
    check_pipes(pipes)
    top = max(p.max_len for p in pipes)
    if l_.size and int(l_.max()) > top:
        raise TidalError(f"sequence of length {int(l_.max())} exceeds the MaxLen {top} of every pipeline")
    if l_.size == 0:
        return DispatchResult(tuple(() for _ in pipes), 0.0, tuple(0.0 for _ in pipes))
    small = l_.size * len(pipes) <= 512
    rounds = max_rounds if max_rounds is not None else 20 + len(pipes) + (l_.size if small else 0)
    st = _State(pipes, l_, _greedy(l_, pipes))
    _local_search(st, rounds, pairs=small, target=target)
    res = _result(st, len(pipes))
    if small and restarts:
        # Small instances: a few seeded random-order restarts (cheap here, and they escape LPT's worst cases).
        rng = np.random.default_rng(seed)
        for _ in range(restarts):
            st = _State(pipes, l_, _greedy(l_, pipes, rng.permutation(l_.size)))
            _local_search(st, rounds, pairs=True)
            cand = _result(st, len(pipes))
            if cand.objective < res.objective:
                res = cand
    if exact:
        from tidal.planner.exact import dispatch_milp

        ex = dispatch_milp(l_, pipes, time_limit=time_limit)
        if ex is not None:
            ex_res = evaluate(l_, pipes, ex)
            if ex_res.objective < res.objective:
                return ex_res
    return res


def dispatch_hydraulis(lengths, pipes: Sequence[PipeCost], *, trials: int = 100, seed: int = 0) -> DispatchResult:
    """Faithful re-implementation of Hydraulis Alg. 1 (baseline): `trials` random shuffles, each dispatching sequences
    one by one to the eligible pipeline that minimises the max over pipelines of C_j + E_j, with Hydraulis' per-sequence
    T(l) = a l^2 + b l + c and E_j = T(l_max) (PP - 1). Returns the best trial, re-scored with our D_j."""
    l_ = check_lengths(lengths)
    check_pipes(pipes)
    rng = np.random.default_rng(seed)
    D = len(pipes)
    best_obj, best_owner = float("inf"), None
    for _ in range(trials):
        perm = rng.permutation(l_.size)
        Cj = [0.0] * D
        Ej = [0.0] * D
        lmax = [0] * D
        owner = np.empty(l_.size, dtype=np.int64)
        for i in perm.tolist():
            x = int(l_[i])
            o_min, j_best = float("inf"), -1
            # max_{k != j} (C_k + E_k) from the two largest totals: same result as the O(D) scan of line 11
            tot = [Cj[k] + Ej[k] for k in range(D)]
            k1 = max(range(D), key=tot.__getitem__)
            second = max((tot[k] for k in range(D) if k != k1), default=0.0)
            for j, p in enumerate(pipes):
                if x > p.max_len:
                    continue
                lm = max(x, lmax[j])
                cj = Cj[j] + p.a * x * x + p.b * x + p.c
                ej = (p.a * lm * lm + p.b * lm + p.c) * (p.pp - 1)
                o = max(cj + ej, second if j == k1 else tot[k1])
                if o < o_min:
                    o_min, j_best = o, j
            if j_best < 0:
                raise TidalError(f"sequence of length {x} exceeds the MaxLen of every pipeline")
            p = pipes[j_best]
            Cj[j_best] += p.a * x * x + p.b * x + p.c
            lmax[j_best] = max(lmax[j_best], x)
            Ej[j_best] = (p.a * lmax[j_best] ** 2 + p.b * lmax[j_best] + p.c) * (p.pp - 1)
            owner[i] = j_best
        obj = max(Cj[k] + Ej[k] for k in range(D))
        if obj < best_obj:
            best_obj, best_owner = obj, owner
    if best_owner is None:
        return DispatchResult(tuple(() for _ in pipes), 0.0, tuple(0.0 for _ in pipes))
    return _result(_State(pipes, l_, best_owner), D)
