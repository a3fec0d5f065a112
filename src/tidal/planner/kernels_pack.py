"""The packer's and the bounds' loops, written once (see kernels.py and decisions 49, 89 and 96).

The packer (packing.pack): LPT, the move/swap rounds, FFD, the search over micro-batch counts and `pack_core`, pack's
whole heuristic path in one call (its sums are numpy's: kernels_sums.np_sum; decision 115). The bounds: the
top-documents branch and bound (bounds.top_docs_bound: `top_search`, `ts_expand`); the mode bound's price search is in
kernels_modes.py. `COMPILED` / `PLAIN` / `loops()` as in kernels.py (kernels.modes); the tests run both on seeded
inputs and compare them float for float. Import this module lazily (importing numba takes a second).
"""
from __future__ import annotations

import numpy as np

from tidal.planner import kernels_sums
from tidal.planner.kernels import modes
from tidal.planner.kernels_sums import np_sum
from tidal.planner.pipecost import best_v, bound_value, packed_value, pipe_value


def lpt(l_, w, order, V, M, c):
    """Capacity-aware LPT: each sequence (in `order`) into the micro-batch with the least (time, index) among those
    with room; micro-batch times start at c. Returns (bin per sequence, ok); ok False when one fits nowhere."""
    T = np.full(V, c)
    tok = np.zeros(V, np.int64)
    bin_of = np.empty(l_.size, np.int64)
    for t in range(order.size):
        i = order[t]
        x = l_[i]
        kb = -1
        for k in range(V):
            if tok[k] + x <= M and (kb < 0 or T[k] < T[kb]):
                kb = k
        if kb < 0:
            return bin_of, False
        tok[kb] += x
        bin_of[i] = kb
        T[kb] = T[kb] + w[i]
    return bin_of, True


def refine(bin_of, l_, w, T, tok, V, M, rounds, max_docs, asc):
    """Move/swap sequences off the slowest micro-batch while that strictly lowers it (in place; T: micro-batch times,
    tok: token counts), at most `rounds` rounds. Candidates: the first document of each distinct length of the slowest
    micro-batch, longest first, at most `max_docs`; for each, moves to micro-batches in index order, then swaps with
    every other document in index order; the first strict best wins. `asc`: the sequences by ascending length (any order
    among equal lengths). The work w must not fall as the length grows (a, b, d >= 0, as check_pipe requires): then
    a swap's two new times are monotone in the partner's length, so each round buckets the others by micro-batch in
    `asc` order and visits, per micro-batch, only the run of partners whose both times can be <= the best so far (a
    binary search finds its start); a tie at the best goes to the lower index: the swap the index-order scan took
    (decision 121)."""
    n = l_.size
    mine = np.empty(n, np.int64)
    byb = np.empty(n, np.int64)  # the sequences grouped by micro-batch, each group by ascending length
    cnt = np.zeros(V + 1, np.int64)
    for _ in range(rounds):
        b = np.argmax(T)  # the slowest micro-batch, the first on ties
        tb = T[b]
        nm = 0
        cnt[:] = 0
        for i in range(n):
            cnt[bin_of[i] + 1] += 1
            if bin_of[i] == b:
                mine[nm] = i
                nm += 1
        for k in range(V):
            cnt[k + 1] += cnt[k]
        for t in range(n):
            i = asc[t]
            byb[cnt[bin_of[i]]] = i
            cnt[bin_of[i]] += 1  # afterwards cnt[k] is group k's end, cnt[k - 1] (0 for k = 0) its start
        ord_ = np.argsort(-l_[mine[:nm]], kind="mergesort")
        best = np.inf
        bi = -1
        bk = -1
        be = -1
        used = 0
        last = -1
        for r in range(nm):
            i = mine[ord_[r]]
            x = l_[i]
            if x == last:
                continue
            if used == max_docs:
                break
            last = x
            used += 1
            wx = w[i]
            if nm > 1:
                for k in range(V):
                    if k != b and tok[k] + x <= M:
                        v = max(tb - wx, T[k] + wx)
                        if v < best:
                            best, bi, bk, be = v, i, k, -1
            swap_here = False  # best is a swap of this document (a tie then goes to the lower index)
            for k in range(V):
                if k == b:
                    continue
                lo = 0 if k == 0 else cnt[k - 1]
                hi = cnt[k]
                while lo < hi:  # the first partner with room in k whose time on k, T[k] - w[e] + wx, is <= best
                    mid = (lo + hi) // 2
                    e = byb[mid]
                    if l_[e] >= tok[k] + x - M and T[k] - w[e] + wx <= best:
                        hi = mid
                    else:
                        lo = mid + 1
                for t in range(lo, cnt[k]):
                    e = byb[t]
                    le = l_[e]
                    if le > M - tok[b] + x or tb - wx + w[e] > best:
                        break  # longer partners do not fit in b, or their time on b is above best
                    if le != x:
                        v = max(tb - wx + w[e], T[k] - w[e] + wx)
                        if v < best or (v == best and swap_here and e < be):
                            best, bi, bk, be = v, i, k, e
                            swap_here = True
        if not best < tb * (1 - 1e-12):
            return
        T[b] -= w[bi]
        T[bk] += w[bi]
        tok[b] -= l_[bi]
        tok[bk] += l_[bi]
        bin_of[bi] = bk
        if be >= 0:
            T[bk] -= w[be]
            T[b] += w[be]
            tok[bk] -= l_[be]
            tok[b] += l_[be]
            bin_of[be] = b


def ffd(l_, order, M):
    """Token first-fit-decreasing: each sequence (in `order`) into the first bin with room, else a new one."""
    room = np.empty(l_.size, np.int64)
    nb = 0
    bin_of = np.empty(l_.size, np.int64)
    for t in range(order.size):
        i = order[t]
        x = l_[i]
        k = 0
        while k < nb and room[k] < x:
            k += 1
        if k == nb:
            room[k] = M
            nb += 1
        room[k] -= x
        bin_of[i] = k
    return bin_of


def pack_score(bin_of, w, c, q):
    """(PP - 1 + used micro-batches) * (c + the slowest one's work), or their sum when PP = 1 (pipecost.packed_value,
    decision 94); sums in index order (np.bincount adds its weights one at a time in index order)."""
    T = np.bincount(bin_of, weights=w)
    cnt = np.bincount(bin_of)
    used = 0
    mx = -np.inf
    tot = 0.0
    for k in range(cnt.size):
        if cnt[k] > 0:
            used += 1
            tot += T[k]
            if T[k] > mx:
                mx = T[k]
    return packed_value(q, c, tot, c + mx, used)


def pack_attempt(V, l_, w, order, M, c, q, W, wmax, vmin, rounds, tried, best_bins, best, asc):
    """pack_search's attempt(V): LPT into V micro-batches and the move/swap rounds, unless V was tried or its bound
    cannot beat `best`. Returns (value, best bins, best)."""
    if not vmin <= V <= l_.size:
        return np.inf, best_bins, best
    if not np.isnan(tried[V]):
        return tried[V], best_bins, best
    if pipe_value(q, c, W, wmax, V) >= best * (1 - 1e-12):
        tried[V] = np.inf
        return np.inf, best_bins, best
    bin_of, ok = lpt(l_, w, order, V, M, c)
    val = np.inf
    if ok:
        T = np.bincount(bin_of, weights=w, minlength=V) + c  # work summed in index order, then c
        tok = np.bincount(bin_of, weights=l_, minlength=V).astype(np.int64)  # token sums < 2^53: exact
        refine(bin_of, l_, w, T, tok, V, M, rounds, 32, asc)
        val = pack_score(bin_of, w, c, q)
    tried[V] = val
    if val < best:
        return val, bin_of, val
    return val, best_bins, best


def pack_search(l_, w, order, M, c, q, W, wmax, vmin, v_opt, v_hi, rounds):
    """packing.pack's heuristic: FFD, then LPT + rounds for the candidate V (vmin, v_opt - 1 .. v_opt + 2 and FFD's
    count, within [vmin, v_hi]) by (bound f(V), V), then a walk from the incumbent's V while it improves; a V whose
    bound cannot beat the incumbent is skipped. Returns (bins, score)."""
    n = l_.size
    asc = order[::-1].copy()  # ascending lengths (refine's partner order)
    best_bins = ffd(l_, order, M)
    best = pack_score(best_bins, w, c, q)
    tried = np.full(n + 1, np.nan)
    raw = np.unique(np.array([vmin, v_opt - 1, v_opt, v_opt + 1, v_opt + 2, best_bins.max() + 1], np.int64))
    cands = raw[(raw >= vmin) & (raw <= v_hi)]
    f = np.empty(cands.size)
    for t in range(cands.size):
        f[t] = pipe_value(q, c, W, wmax, cands[t])
    for V in cands[np.argsort(f, kind="mergesort")]:  # by (bound, V): np.unique's ascending V, sorted stably
        _, best_bins, best = pack_attempt(V, l_, w, order, M, c, q, W, wmax, vmin, rounds, tried, best_bins, best,
                                         asc)
    v_best = np.unique(best_bins).size  # the incumbent's micro-batch count
    for step in (1, -1):
        V = v_best + step
        while vmin <= V <= n:
            val, best_bins, best = pack_attempt(V, l_, w, order, M, c, q, W, wmax, vmin, rounds, tried, best_bins,
                                               best, asc)
            if not val <= best:
                break
            V += step
    return best_bins, best


def pack_bins(l_, a, b, d, c, q, M, S, su):
    """packing.pack's heuristic for n >= 1 sequences, from the lengths to a bin per sequence, in one call: the work
    w = a l^2 + b l + d per sequence, W (kernels_sums.np_sum: numpy's sum, the same float), w_max, V_min =
    ceil(S / M), the bound's minimiser (pipecost.best_v; 1: one micro-batch, optimal), the longest-first order, the V
    range (su = S // UtilLen, computed by the caller) and pack_search. Returns (bins, their score, w, W, w_max,
    V_min): the exact path's start."""
    n = l_.size
    lf = l_.astype(np.float64)
    w = a * lf * lf + b * lf + d
    wmax = w.max()
    W = np_sum(w, 0, n)
    vmin = max(1, -(-S // M))
    vo = best_v(q, c, W, wmax, vmin, n)[0]
    if vo == 1:  # one micro-batch meets the lower bound f(1) = PP (c + W): optimal
        return np.zeros(n, np.int64), pipe_value(q, c, W, wmax, 1), w, W, wmax, vmin
    order = np.argsort(-l_, kind="mergesort")
    v_util = min(n, max(vmin, su))
    v_hi = min(n, max(v_util, vo + 2))
    bins, best = pack_search(l_, w, order, M, c, q, W, wmax, vmin, vo, v_hi, 20 + 2 * n)
    return bins, best, w, W, wmax, vmin


def pack_core(l_, a, b, d, c, q, M, S, su):
    """packing.pack's heuristic path in one call: pack_bins, then `layout` (one micro-batch when pack_bins finds
    V = 1 optimal: layout's time is then pipe_value(1)'s float, c + W = W / 1 + c). Returns layout's tuple."""
    bins, _, w, _, _, _ = pack_bins(l_, a, b, d, c, q, M, S, su)
    return layout(bins, l_, w, c, q)


def layout(bins, l_, w, c, q):
    """The packing whose sequence i (length l_[i], work w[i]) is in bin bins[i], laid out as every packer's
    (packing.finish, pack_core): the micro-batches by first (smallest) index, ascending indices within, empty bins
    dropped; and their time as packing.pipeline_time gives it (pipecost.packed_value of the per-micro-batch work sums,
    each np_sum of the micro-batch's works in index order; their total summed in micro-batch order, as Python's sum
    does). Returns (indices grouped by micro-batch, each micro-batch's end in them, est, the largest micro-batch's
    tokens)."""
    rank = np.full(bins.max() + 1, -1, np.int64)  # micro-batch rank by first index
    nr = 0
    for i in range(l_.size):
        if rank[bins[i]] < 0:
            rank[bins[i]] = nr
            nr += 1
    r_of = rank[bins]
    ol = np.argsort(r_of, kind="mergesort")  # by rank, ascending indices within (a stable sort)
    ends = np.cumsum(np.bincount(r_of))
    lo, wo = l_[ol], w[ol]
    tot, top, tmax, s = 0.0, -np.inf, 0, 0
    for r in range(nr):
        x = np_sum(wo, s, ends[r] - s)
        tot += x
        top = max(top, c + x)
        tmax = max(tmax, lo[s:ends[r]].sum())
        s = ends[r]
    return ol, ends, packed_value(q, c, tot, top, nr), tmax


def ts_expand(t, x, A, B, D, C, Q, M, cnt, used, ocls, oW, otok, owm, ocnt, n_o, fd, fw):
    """The options of top_search's node for document x at depth t, into fd[t] / fw[t] sorted by bound (stable):
    each distinct open pipeline (identical open ones are one branch), then a new pipeline of each class with one left.
    fw: >= 0 an open pipeline, -1 - k a new one of class k. Returns their number."""
    K = A.size
    d = np.empty(n_o + K)
    which = np.empty(n_o + K, np.int64)
    no = 0
    for o in range(n_o):
        k = ocls[o]
        if x > M[k]:
            continue
        dup = False
        for o2 in range(o):
            if ocls[o2] == k and oW[o2] == oW[o] and otok[o2] == otok[o] and owm[o2] == owm[o] and ocnt[o2] == ocnt[o]:
                dup = True
                break
        if dup:
            continue
        wx = A[k] * x * x + B[k] * x + D[k]
        d[no] = bound_value(Q[k], C[k], M[k], oW[o] + wx, otok[o] + x, max(owm[o], wx), ocnt[o] + 1)
        which[no] = o
        no += 1
    for k in range(K):
        if used[k] < cnt[k] and x <= M[k]:
            wx = A[k] * x * x + B[k] * x + D[k]
            d[no] = bound_value(Q[k], C[k], M[k], wx, x, wx, 1)
            which[no] = -1 - k
            no += 1
    order = np.argsort(d[:no], kind="mergesort")
    for r in range(no):
        fd[t, r] = d[order[r]]
        fw[t, r] = which[order[r]]
    return no


def top_search(top, A, B, D, C, Q, M, cnt, limit):
    """bounds.top_docs_bound's branch and bound: min over dispatches of the documents `top` (longest first) of the max
    pipeline bound (pipecost.bound_value; classes k of identical pipelines with A, B, D, C, Q = PP - 1, M = MaxLen and
    cnt pipelines each). Depth t places top[t] on each option (ts_expand: an open pipeline, identical open ones being
    one branch, or a new pipeline of a class with one left, unopened pipelines of a class being interchangeable),
    cheapest bound first; a branch stops once max(its bound so far, the option's) reaches the best leaf. An explicit
    depth-first stack, not recursion (numba cannot cache recursive functions). -1.0 when the search passes `limit`
    nodes."""
    n = top.size
    K = A.size
    used = np.zeros(K, np.int64)
    ocls = np.zeros(n + 1, np.int64)
    oW = np.zeros(n + 1)
    otok = np.zeros(n + 1, np.int64)
    owm = np.zeros(n + 1)
    ocnt = np.zeros(n + 1, np.int64)
    fd = np.zeros((n + 1, n + K + 1))  # per depth: option bounds, sorted
    fw = np.zeros((n + 1, n + K + 1), np.int64)  # per depth: option (open pipeline, or -1 - class)
    fno = np.zeros(n + 1, np.int64)
    fpos = np.zeros(n + 1, np.int64)
    fcur = np.zeros(n + 1)
    # what the option taken at depth t changed: the open pipeline's previous sums, or the count of open pipelines
    uo = np.zeros(n + 1, np.int64)
    sW = np.zeros(n + 1)
    stok = np.zeros(n + 1, np.int64)
    swm = np.zeros(n + 1)
    scnt = np.zeros(n + 1, np.int64)
    sno = np.zeros(n + 1, np.int64)
    best = np.inf
    nodes = 1  # the root: rec(0, 0.0)
    if nodes > limit:
        return -1.0
    if n == 0:
        return 0.0
    n_o = 0
    fno[0] = ts_expand(0, top[0], A, B, D, C, Q, M, cnt, used, ocls, oW, otok, owm, ocnt, n_o, fd, fw)
    fpos[0] = 0
    fcur[0] = 0.0
    t = 0
    while t >= 0:
        r = fpos[t]
        nc = max(fcur[t], fd[t, r]) if r < fno[t] else 0.0
        if r >= fno[t] or nc >= best:  # node t done: back to its parent, undoing the parent's option
            t -= 1
            if t >= 0:
                o = uo[t]
                if o >= 0:
                    oW[o], otok[o], owm[o], ocnt[o] = sW[t], stok[t], swm[t], scnt[t]
                else:
                    n_o = sno[t]
                    used[-1 - o] -= 1
            continue
        fpos[t] = r + 1
        x = top[t]
        o = fw[t, r]
        uo[t] = o
        if o >= 0:
            k = ocls[o]
            wx = A[k] * x * x + B[k] * x + D[k]
            sW[t], stok[t], swm[t], scnt[t] = oW[o], otok[o], owm[o], ocnt[o]
            oW[o], otok[o], owm[o], ocnt[o] = oW[o] + wx, otok[o] + x, max(owm[o], wx), ocnt[o] + 1
        else:
            k = -1 - o
            wx = A[k] * x * x + B[k] * x + D[k]
            used[k] += 1
            sno[t] = n_o
            ocls[n_o], oW[n_o], otok[n_o], owm[n_o], ocnt[n_o] = k, wx, x, wx, 1
            n_o += 1
        # enter the child node rec(t + 1, nc)
        nodes += 1
        if nodes > limit:
            return -1.0
        fno[t + 1] = 0  # a leaf or a pruned child has no options: the loop backs out of it, undoing this option
        if nc < best:
            if t + 1 == n:
                best = nc
            else:
                fno[t + 1] = ts_expand(t + 1, top[t + 1], A, B, D, C, Q, M, cnt, used, ocls, oW, otok, owm, ocnt, n_o,
                                        fd, fw)
                fpos[t + 1] = 0
                fcur[t + 1] = nc
        t += 1
    return best


# the packer's and the bounds' loops by the names their callers use, plain and compiled
_PACK = {"lpt": lpt, "refine": refine, "ffd": ffd, "pack_score": pack_score, "pack_attempt": pack_attempt,
         "pack_search": pack_search, "pack_bins": pack_bins, "pack_core": pack_core, "layout": layout,
         "ts_expand": ts_expand, "top_search": top_search}
if kernels_sums.COMPILED is not None:  # pack_core calls the compiled np_sum (bound before compiling, as pipecost's)
    np_sum = kernels_sums.COMPILED.np_sum
PLAIN, COMPILED, loops = modes(_PACK, {"np": np, "pipe_value": pipe_value, "packed_value": packed_value,
                                       "bound_value": bound_value, "best_v": best_v,
                                       "np_sum": kernels_sums.PLAIN.np_sum},
                               globals(), ("bound_value", "pipe_value", "packed_value", "best_v"))
