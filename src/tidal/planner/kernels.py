"""The dispatch's loops, written once (numba-compiled where installed, plain Python otherwise; decisions 49, 89, 96).

The dispatch greedy (list scheduling, longest first, with its jump scan) and the dispatch local search (moves, swaps
and pair swaps off the bottleneck pipeline, one round at a time) cannot be vectorised: each step depends on the
previous one. They are their only implementation: `COMPILED` holds them compiled (numba.njit, cached on disk, no
fastmath), `PLAIN` the same functions as plain Python (`plain`: a namespace where they call each other uncompiled),
and `loops()` picks the first available; the tests run both and compare them float for float. numba is a core
dependency (decision 92): the plain mode is the reference and a slow fallback (it indexes numpy arrays one element
at a time). The pipeline cost formula (pipecost.py, `compile_pipecost`) is inlined into them. The packer's and the
bounds' loops are in kernels_pack.py, Hydraulis Alg. 1 in alg1.py, by the same pattern.

Import this module lazily (importing numba takes about a second).
"""
from __future__ import annotations

import builtins
import functools
import math
import types

import numpy as np

from tidal.planner import pipecost
from tidal.planner.pipecost import add_cost, cost1, cost1_floor

try:
    from numba import njit
except ImportError:  # pragma: no cover - exercised where numba is absent
    njit = None

AVAILABLE = njit is not None


def sift_down(key, ids, off, n, pos):
    """Restore the min-heap on key/ids[off:off + n] (ordered by (key, id)) from position pos downwards."""
    while True:
        left = 2 * pos + 1
        if left >= n:
            return
        m = left
        r = left + 1
        if r < n and (key[off + r] < key[off + m] or (key[off + r] == key[off + m] and ids[off + r] < ids[off + m])):
            m = r
        if key[off + m] < key[off + pos] or (key[off + m] == key[off + pos] and ids[off + m] < ids[off + pos]):
            key[off + m], key[off + pos] = key[off + pos], key[off + m]
            ids[off + m], ids[off + pos] = ids[off + pos], ids[off + m]
            pos = m
        else:
            return


def sift_up(key, ids, off, pos):
    while pos > 0:
        par = (pos - 1) // 2
        if key[off + pos] < key[off + par] or (key[off + pos] == key[off + par] and ids[off + pos] < ids[off + par]):
            key[off + pos], key[off + par] = key[off + par], key[off + pos]
            ids[off + pos], ids[off + par] = ids[off + par], ids[off + pos]
            pos = par
        else:
            return


def greedy(lengths, order, ca, cb, cc, cd, cq, cm, members, moff, mcount, pmax, scan):
    """The dispatch greedy (dispatch.greedy_owner): each sequence (in `order`) to the eligible pipeline with the least
    resulting cost (pipecost.add_cost),
    trying per class its first empty pipeline and its least-loaded used one (heap top by (cost, index)), or every
    used one (if `scan`) when adding to the least-loaded one costs more than the document's work plus one
    micro-batch.
    Classes k hold pipelines members[moff[k]:moff[k] + mcount[k]] in ascending order. Returns the owner per sequence
    (-1 for the first sequence that fits no pipeline, after which the rest is left unset)."""
    K = ca.size
    P = pmax.size
    W = np.zeros(P)
    T = np.zeros(P, np.int64)
    L = np.zeros(P)
    U = np.zeros(P, np.int64)
    G = np.zeros(P, np.int64)
    hkey = np.zeros(P)
    hid = np.zeros(P, np.int64)
    hsize = np.zeros(K, np.int64)
    nempty = np.zeros(K, np.int64)  # pipelines of class k used so far (members are opened in index order)
    owner = np.full(lengths.size, -1, np.int64)
    for t in range(order.size):
        i = order[t]
        x = lengths[i]
        have = False
        best_v = 0.0
        best_j = -1
        best_k = -1
        wbest = 0.0
        for k in range(K):
            M = cm[k]
            if x > M:
                continue
            a, b, c, q = ca[k], cb[k], cc[k], cq[k]
            wx = a * x * x + b * x + cd[k]
            if hsize[k] > 0:
                j = hid[moff[k]]
                big = 1 if 2 * x > M else 0
                v = add_cost(c, q, M, W[j], T[j], L[j], U[j], G[j], x, wx, big)
                if scan and v > (hkey[moff[k]] + wx + c) * (1 + 1e-9):
                    # on the least-loaded pipeline x would cost more than its work and one micro-batch (a V_min jump
                    # with a long document: (V + 1)(c + w_max)): try every used pipeline of the class
                    for p in range(1, hsize[k]):
                        jj = hid[moff[k] + p]
                        vv = add_cost(c, q, M, W[jj], T[jj], L[jj], U[jj], G[jj], x, wx, big)
                        if vv < v or (vv == v and jj < j):
                            v, j = vv, jj
                if not have or v < best_v or (v == best_v and j < best_j):
                    have, best_v, best_j, best_k, wbest = True, v, j, k, wx
            if nempty[k] < mcount[k]:
                j = members[moff[k] + nempty[k]]
                v = (q + 1) * (c + wx)
                if not have or v < best_v or (v == best_v and j < best_j):
                    have, best_v, best_j, best_k, wbest = True, v, j, k, wx
        if not have:
            return owner, i
        j = best_j
        k = best_k
        off = moff[k]
        if T[j] == 0:
            nempty[k] += 1
            n = hsize[k]
            hkey[off + n] = best_v
            hid[off + n] = j
            hsize[k] = n + 1
            sift_up(hkey, hid, off, n)
        else:  # j is in the heap (its top unless a jump scan chose another); its key only grows
            p = 0
            while hid[off + p] != j:
                p += 1
            hkey[off + p] = best_v
            sift_down(hkey, hid, off, hsize[k], p)
        W[j] += wbest
        T[j] += x
        U[j] += 1
        G[j] += 1 if 2 * x > pmax[j] else 0
        if wbest > L[j]:
            L[j] = wbest
        owner[i] = j
    return owner, -1


def ls_refresh(j, owner, lf, A, B, C, D, Q1, M, R, S, Q, N, G, top1, cnt1, top2, load):
    """Pipeline j's top-two lengths (0.0 where none), the longest's count and its load, rescanned."""
    x = lf[owner == j]
    m = x.max() if x.size else 0.0
    below = x[x < m]
    top1[j], cnt1[j], top2[j] = m, (x == m).sum(), below.max() if below.size else 0.0
    load[j] = cost1(A[j], B[j], C[j], D[j], Q1[j], M[j], R[j], Q[j], S[j], N[j], m, G[j])


def ls_move(i, k, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load):
    """Document i to pipeline k (local_search's move): O(1) sums; the top-two lengths (top1, its count cnt1, top2) of
    k in O(1), those of j in O(1) unless i was j's only longest document or one of its second longest (then an O(B)
    rescan, ls_refresh). The same values as rescanning both (lengths are exact in float64), so the same loads."""
    j = owner[i]
    x = lf[i]
    S[j] -= x
    Q[j] -= x * x
    N[j] -= 1
    G[j] -= 1.0 if x > H[j] else 0.0
    G[k] += 1.0 if x > H[k] else 0.0
    S[k] += x
    Q[k] += x * x
    N[k] += 1
    owner[i] = k
    # the top-two lengths change in O(1) unless j loses its only longest document or one of its second longest
    if x < top2[j] or (x == top1[j] and cnt1[j] > 1):
        cnt1[j] -= 1 if x == top1[j] else 0
        load[j] = cost1(A[j], B[j], C[j], D[j], Q1[j], M[j], R[j], Q[j], S[j], N[j], top1[j], G[j])
    else:
        ls_refresh(j, owner, lf, A, B, C, D, Q1, M, R, S, Q, N, G, top1, cnt1, top2, load)
    if x > top1[k]:
        top2[k] = top1[k]
        top1[k] = x
        cnt1[k] = 1
    elif x == top1[k]:
        cnt1[k] += 1
    elif x > top2[k]:
        top2[k] = x
    load[k] = cost1(A[k], B[k], C[k], D[k], Q1[k], M[k], R[k], Q[k], S[k], N[k], top1[k], G[k])


def local_search(l_, lf, owner, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load, asc, desc, max_rounds,
                 max_docs, pairs, target, min_gain):
    """The dispatch's local search (dispatch.local_search), on the arrays of a dispatch.SearchState (updated in
    place). Per round: find the bottleneck pipeline j; for up to `max_docs` of its documents (one per distinct
    length, longest first) try every move to another eligible pipeline, then every swap with a document of another
    pipeline (on large steps, B > 256 and more than 8 pipelines, only with the 8 least-loaded ones), then, when
    nothing helped, `pairs` is set and j holds 2-24 documents, two of j's documents for one of another (pair_swap).
    A move must lower max(new cost of j, new cost of the other) below j's cost by more than `min_gain` (relative);
    the least such value is taken, ties to the first in (document of j, move before swap, pipeline / partner index)
    order. Per pipeline A, B, C, D, Q1 = PipeCost.q, M = MaxLen, R = sqrt(Q1 / c), H = M / 2 come in as arrays; the
    documents by ascending and by descending length, ties by index, as `asc` and `desc` (dispatch.length_orders).
    Returns True when no move improves (or the load is <= `target`), False when max_rounds ran out. cost1 is
    skipped where pipecost.cost1_floor (a float-safe lower bound, monotone in the sums) shows a candidate cannot
    win, and whole ranges of swap partners by their length (decisions 107, 117): the same moves as evaluating all."""
    n_p = S.size
    n = owner.size
    uidx = np.empty(n, np.int64)
    pidx = np.empty(n, np.int64)
    sel = np.empty(max_docs, np.int64)
    part = np.zeros(n_p, np.bool_)
    pstart = np.zeros(n_p, np.int64)
    pend = np.zeros(n_p, np.int64)
    for _ in range(max_rounds):
        j = np.argmax(load)  # the bottleneck, the first on ties
        dmax = load[j]
        if dmax <= target or dmax <= 0:
            return True
        ns = 0
        last = -1
        for r in range(n):  # j's documents by length descending, then index: the first of each length
            i = desc[r]
            if owner[i] != j:
                continue
            if l_[i] != last:
                if ns == max_docs:
                    break
                sel[ns] = i
                ns += 1
                last = l_[i]
        aj, bj, cj, dj, qj, mj, rj, hj = A[j], B[j], C[j], D[j], Q1[j], M[j], R[j], H[j]
        best = dmax * (1 - min_gain)
        bi = -1
        bk = -1
        be = -1
        bp = -1
        bu = -1  # the swap's document of j (its index in sel) when the best so far is a swap, else -1
        for u in range(ns):  # move one document of j to another eligible pipeline
            x = lf[sel[u]]
            x2 = x * x
            lj = top2[j] if (x == top1[j] and cnt1[j] == 1) else top1[j]
            nj = cost1(aj, bj, cj, dj, qj, mj, rj, Q[j] - x2, S[j] - x, N[j] - 1, lj, G[j] - (1.0 if x > hj else 0.0))
            if not nj < best:
                continue
            for k in range(n_p):
                if k == j or not x <= M[k]:
                    continue
                # cost1 only where its float lower bound (pipecost.cost1_floor) can beat `best`: the same moves
                if cost1_floor(A[k], B[k], C[k], D[k], Q1[k], M[k], Q[k] + x2, S[k] + x, N[k] + 1, max(top1[k], x),
                               G[k] + (1.0 if x > H[k] else 0.0)) >= best:
                    continue
                nk = cost1(A[k], B[k], C[k], D[k], Q1[k], M[k], R[k], Q[k] + x2, S[k] + x, N[k] + 1, max(top1[k], x),
                            G[k] + (1.0 if x > H[k] else 0.0))
                v = max(nj, nk)
                if v < best:
                    best, bi, bk, be, bp = v, sel[u], k, -1, -1
        # swap partners: the other pipelines' documents (large steps: of the 8 least-loaded, by (load, index))
        if n > 256 and n_p > 8:
            part[:] = False
            for k in np.argsort(load, kind="mergesort")[:8]:
                part[k] = True
        else:
            part[:] = True
        part[j] = False
        # a swap's value depends on the partner's (length, pipeline) only: the first document of each (by index)
        # stands for the others. Pipeline k's in uidx[pstart[k]:pend[k]], lengths ascending (counting sort of `asc`)
        pend[:] = 0
        for i in range(n):
            if part[owner[i]]:
                pend[owner[i]] += 1
        ue = 0
        for k in range(n_p):
            pstart[k] = ue
            ue += pend[k]
            pend[k] = pstart[k]
        for r in range(n):
            i = asc[r]
            k = owner[i]
            if part[k] and (pend[k] == pstart[k] or l_[uidx[pend[k] - 1]] != l_[i]):
                uidx[pend[k]] = i
                pend[k] += 1
        if ue:
            # swaps, per partner pipeline only the lengths both cost floors leave able to reach `best`: the
            # partner's floor does not rise with the partner's length (binary search), j's does not fall (stop); a
            # tie at `best` goes to the earlier (document of j, partner index): the index-order scan's move
            for u in range(ns):
                x = lf[sel[u]]
                x2 = x * x
                lj = top2[j] if (x == top1[j] and cnt1[j] == 1) else top1[j]
                gx = G[j] - (1.0 if x > hj else 0.0)
                for ke in range(n_p):
                    t0 = pstart[ke]
                    t1 = pend[ke]
                    if t0 == t1 or not x <= M[ke]:
                        continue
                    ak, bk_, ck, dk, qk, mk, hk = A[ke], B[ke], C[ke], D[ke], Q1[ke], M[ke], H[ke]
                    gk = G[ke] + (1.0 if x > hk else 0.0)  # the partner's long documents with x, before giving one
                    lo = t0
                    hi = t1
                    while lo < hi:  # the first partner length whose floor is <= best
                        mid = (lo + hi) // 2
                        le = lf[uidx[mid]]
                        lk = top2[ke] if (le == top1[ke] and cnt1[ke] == 1) else top1[ke]
                        if cost1_floor(ak, bk_, ck, dk, qk, mk, Q[ke] - le * le + x2, S[ke] - le + x, N[ke],
                                       max(lk, x), gk - (1.0 if le > hk else 0.0)) > best:
                            lo = mid + 1
                        else:
                            hi = mid
                    for t in range(lo, t1):
                        e = uidx[t]
                        le = lf[e]
                        if not le <= mj:
                            break
                        if le == x:
                            continue
                        gj = gx + (1.0 if le > hj else 0.0)
                        if cost1_floor(aj, bj, cj, dj, qj, mj, Q[j] - x2 + le * le, S[j] - x + le, N[j],
                                       max(lj, le), gj) > best:
                            break
                        lk = top2[ke] if (le == top1[ke] and cnt1[ke] == 1) else top1[ke]
                        g2 = gk - (1.0 if le > hk else 0.0)
                        if cost1_floor(ak, bk_, ck, dk, qk, mk, Q[ke] - le * le + x2, S[ke] - le + x, N[ke],
                                       max(lk, x), g2) > best:
                            continue
                        nj = cost1(aj, bj, cj, dj, qj, mj, rj, Q[j] - x2 + le * le, S[j] - x + le, N[j],
                                   max(lj, le), gj)
                        if nj > best or (nj == best and not (bu == u and e < be)):
                            continue
                        nk = cost1(ak, bk_, ck, dk, qk, mk, R[ke], Q[ke] - le * le + x2, S[ke] - le + x, N[ke],
                                   max(lk, x), g2)
                        v = max(nj, nk)
                        if v < best or (v == best and bu == u and e < be):
                            best, bi, bk, be, bp, bu = v, sel[u], ke, e, -1, u
            if bi < 0 and pairs and 2 <= N[j] <= 24:  # N[j]: j's document count
                nu = 0
                for k in range(n_p):
                    for t in range(pstart[k], pend[k]):
                        pidx[nu] = uidx[t]
                        nu += 1
                pidx[:nu].sort()  # pair_swap scans the representatives in index order
                bi, bk, be, bp = pair_swap(j, np.nonzero(owner == j)[0], pidx[:nu], lf, owner, A, B, C, D, Q1, M, R, H,
                                            S, Q, N, G, top1, cnt1, top2, best)
        if bi < 0:
            return True
        ls_move(bi, bk, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load)
        if be >= 0:
            ls_move(be, j, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load)
        if bp >= 0:
            ls_move(bp, bk, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load)
    return False


def pair_swap(j, mine, eidx, lf, owner, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, best):
    """local_search's pair swap: two documents of j (by sorted position u < v, longest first) for one document of
    another pipeline (in `eidx`), every pair scanned in order. Returns (i, k, e, i2), i = -1 when nothing beats
    `best`."""
    order = mine[np.argsort(-lf[mine], kind="mergesort")]
    nm = order.size
    aj, bj, cj, dj, qj, mj, rj, hj = A[j], B[j], C[j], D[j], Q1[j], M[j], R[j], H[j]
    bi = -1
    bk = -1
    be = -1
    bp = -1
    for u in range(nm - 1):
        # a pair whose lengths (and the longest length left) equal an earlier pair's has the same values: skipped
        if u >= 1 and lf[order[u]] == lf[order[u - 1]]:
            continue
        for v in range(u + 1, nm):
            if v - 1 > u and lf[order[v]] == lf[order[v - 1]]:
                continue
            x1 = lf[order[u]]
            x2 = lf[order[v]]
            if u > 0:
                rest = lf[order[0]]
            elif v > 1:
                rest = lf[order[1]]
            else:
                rest = lf[order[2]] if nm > 2 else 0.0
            q = x1 * x1 + x2 * x2
            s = x1 + x2
            xm = max(x1, x2)
            gj = G[j] - (1.0 if x1 > hj else 0.0) - (1.0 if x2 > hj else 0.0)
            for t in range(eidx.size):
                e = eidx[t]
                le = lf[e]
                ke = owner[e]
                if not (le <= mj and xm <= M[ke]):
                    continue
                nj = cost1(aj, bj, cj, dj, qj, mj, rj, Q[j] - q + le * le, S[j] - s + le, N[j] - 1, max(rest, le),
                            gj + (1.0 if le > hj else 0.0))
                if not nj < best:
                    continue
                hk = H[ke]
                lk = top2[ke] if (le == top1[ke] and cnt1[ke] == 1) else top1[ke]
                nk = cost1(A[ke], B[ke], C[ke], D[ke], Q1[ke], M[ke], R[ke], Q[ke] - le * le + q, S[ke] - le + s,
                            N[ke] + 1,
                            max(lk, xm), G[ke] - (1.0 if le > hk else 0.0) + (1.0 if x1 > hk else 0.0)
                            + (1.0 if x2 > hk else 0.0))
                val = max(nj, nk)
                if val < best:
                    best, bi, bk, be, bp = val, order[u], ke, e, order[v]
    return bi, bk, be, bp


def state_sums(lf, owner, H, S, Q, N, G, top1, cnt1, top2):
    """dispatch.SearchState's per-pipeline sums of the assignment `owner` (into zeroed arrays, in place): sum l (S),
    sum l^2 (Q), count (N), documents longer than H (G), as np.bincount sums its weights (in index order, from 0);
    the longest length (top1) and the longest among the others (top2), as np.maximum.at from 0; cnt1: how many
    documents have the longest length."""
    for i in range(owner.size):
        j = owner[i]
        x = lf[i]
        S[j] += x
        Q[j] += x * x
        N[j] += 1.0
        G[j] += 1.0 if x > H[j] else 0.0
        if x > top1[j]:
            top1[j] = x
    for i in range(owner.size):
        j = owner[i]
        x = lf[i]
        if x == top1[j]:
            cnt1[j] += 1
        elif x > top2[j]:
            top2[j] = x


def pipe_loads(A, B, C, D, Q1, M, R, Q, S, N, top1, G, load):
    """load[j] = pipecost.cost1 of every pipeline j (the dispatch's capacity-aware cost: SearchState's loads)."""
    for j in range(load.size):
        load[j] = cost1(A[j], B[j], C[j], D[j], Q1[j], M[j], R[j], Q[j], S[j], N[j], top1[j], G[j])


def plain(funcs: dict, env: dict) -> types.SimpleNamespace:
    """The functions `funcs` ({name their callers use: function}) as plain Python, each calling the others by those
    names uncompiled, with `env` (modules and helpers) as their other globals: the one source run where numba is
    absent, and by the tests where it is present (a value to pass, no module patching). The builtins go in too: a
    numpy method that imports lazily (ndarray.max's first call) looks them up in its caller's globals."""
    ns = {"__builtins__": builtins, **env}
    for name, f in funcs.items():
        ns[name] = types.FunctionType(f.__code__, ns, name, f.__defaults__)
    return types.SimpleNamespace(**{name: ns[name] for name in funcs})


@functools.cache
def compile_pipecost() -> dict:
    """pipecost's functions compiled (numba.njit, inlined into the loops that call them), in a namespace of their
    own so that each calls the compiled others: {name: dispatcher}. The same source runs as plain Python elsewhere.
    Not cached on disk themselves (numba cannot reload functions of a namespace that is no module); the cached loops
    inline them. A cached loop is keyed on its own file only: after editing pipecost.py, delete the planner's
    __pycache__/*.nbi (or touch kernels.py and kernels_pack.py)."""
    ns: dict = {"math": math, "np": np}
    for name in ("pipe_value", "packed_value", "v_opt", "best_v", "bound_value", "greedy_cost", "add_cost", "cost1",
                 "cost1_floor"):
        f = getattr(pipecost, name)
        ns[name] = njit(inline="always")(types.FunctionType(f.__code__, ns, name, f.__defaults__))
    return ns


def compile_loops(funcs: dict, module: dict, pipecost_names: tuple[str, ...] = ()) -> types.SimpleNamespace | None:
    """The compile step of every kernels*.py module: each of `funcs` ({name its callers use: function}) compiled
    (numba.njit, cached on disk, no fastmath) and bound to that name in `module` (the calling module's globals(), where
    the compiled loops look up each other at compile time), after binding `pipecost_names` there to their compiled,
    inlined versions (compile_pipecost). Returns them as a namespace (the module's COMPILED), or None without numba
    (then `module` is left as it is and the module's PLAIN namespace is the only mode)."""
    if not AVAILABLE:
        return None
    pc = compile_pipecost()
    for name in pipecost_names:
        module[name] = pc[name]
    for name, f in funcs.items():
        module[name] = njit(cache=True)(f)
    return types.SimpleNamespace(**{name: module[name] for name in funcs})


def modes(funcs: dict, env: dict, module: dict, pipecost_names: tuple[str, ...] = ()) -> tuple:
    """A kernels*.py module's two modes of `funcs` and its pick: (PLAIN: plain(funcs, env), COMPILED:
    compile_loops(funcs, module, pipecost_names), loops: a function returning COMPILED where numba is installed, else
    PLAIN, the same source)."""
    p, c = plain(funcs, env), compile_loops(funcs, module, pipecost_names)
    return p, c, lambda: p if c is None else c


# the dispatch's loops (greedy, local_search, pipe_loads) by the names their callers use: plain Python (the reference,
# and the fallback without numba) and compiled (the same source)
_DISPATCH = {"sift_down": sift_down, "sift_up": sift_up, "greedy": greedy, "ls_refresh": ls_refresh,
             "ls_move": ls_move, "pair_swap": pair_swap, "local_search": local_search, "pipe_loads": pipe_loads,
             "state_sums": state_sums}
PLAIN, COMPILED, loops = modes(_DISPATCH, {"np": np, "add_cost": add_cost, "cost1": cost1, "cost1_floor": cost1_floor},
                               globals(), ("add_cost", "cost1", "cost1_floor"))
