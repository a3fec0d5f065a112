"""The dispatch local search before decision 117 (main fbe38d4), kept as the reference that the current one
(kernels.local_search: swap partners visited by pipeline and length, between two cost floors) must equal move for
move. Plain Python, calling the same helpers (kernels.PLAIN's ls_move and pair_swap, pipecost's cost1 and
a copy of cost1_floor as it was)."""

import math

import numpy as np

from tidal.planner import kernels
from tidal.planner.pipecost import cost1

ls_move = kernels.PLAIN.ls_move


def cost1_floor(a, b, c, d, q1, Q, S, N, lmax):
    """pipecost.cost1_floor as it was at main fbe38d4 (whatever m and G)."""
    W = a * Q + b * S + d * N
    lo = W + c
    if q1 > 0:
        r = math.sqrt(W) + math.sqrt(q1 * c)
        lo = max(lo, r * r, (q1 + 1) * (c + (a * lmax * lmax + b * lmax + d)))
    return lo * (1 - 1e-12)

pair_swap = kernels.PLAIN.pair_swap


def local_search_reference(l_, lf, owner, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load, max_rounds,
                           max_docs, pairs, target, min_gain):
    """kernels.local_search as it was before decision 117 (main fbe38d4): every swap partner scanned in index
    order with a strict improvement test. The reference the visiting-order change is compared with."""
    n_p = S.size
    n = owner.size
    mine = np.empty(n, np.int64)
    eidx = np.empty(n, np.int64)
    keep = np.empty(n, np.int64)
    uidx = np.empty(n, np.int64)
    sel = np.empty(max_docs, np.int64)
    light = np.zeros(n_p, np.bool_)
    lid = np.empty(n, np.int64)
    ulid = np.empty(n, np.int64)
    dlen = np.empty(n)
    njl = np.empty(n)
    for _ in range(max_rounds):
        j = 0
        for k in range(1, n_p):
            if load[k] > load[j]:
                j = k
        dmax = load[j]
        if dmax <= target or dmax <= 0:
            return True
        nm = 0
        for i in range(n):
            if owner[i] == j:
                mine[nm] = i
                nm += 1
        ordr = np.argsort(-l_[mine[:nm]], kind="mergesort")
        ns = 0
        last = -1
        for r in range(nm):
            i = mine[ordr[r]]
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
                if cost1_floor(A[k], B[k], C[k], D[k], Q1[k], Q[k] + x2, S[k] + x, N[k] + 1, max(top1[k], x)) >= best:
                    continue
                nk = cost1(A[k], B[k], C[k], D[k], Q1[k], M[k], R[k], Q[k] + x2, S[k] + x, N[k] + 1, max(top1[k], x),
                            G[k] + (1.0 if x > H[k] else 0.0))
                v = max(nj, nk)
                if v < best:
                    best, bi, bk, be, bp = v, sel[u], k, -1, -1
        ne = 0
        if n > 256 and n_p > 8:
            # large steps: swap partners only from the 8 least-loaded pipelines, by (load, index)
            light[:] = False
            for k in np.argsort(load, kind="mergesort")[:8]:
                light[k] = True
            light[j] = False
            for i in range(n):
                if light[owner[i]]:
                    eidx[ne] = i
                    ne += 1
        else:
            for i in range(n):
                if owner[i] != j:
                    eidx[ne] = i
                    ne += 1
        if ne:
            # a swap's value depends on the partner's (length, pipeline) only: the first document of each such pair
            # (in index order) stands for the others, which cannot be strictly better
            # (and j's new cost depends on the partner's length only: computed at most once per distinct length,
            # `dl`, when first needed; the partner's cost1 only where its float lower bound can beat `best`)
            key = l_[eidx[:ne]] * n_p + owner[eidx[:ne]]
            ko = np.argsort(key, kind="mergesort")
            ue = 0
            nd = 0
            for r in range(ne):
                if r == 0 or key[ko[r]] != key[ko[r - 1]]:
                    if r == 0 or l_[eidx[ko[r]]] != l_[eidx[ko[r - 1]]]:
                        dlen[nd] = lf[eidx[ko[r]]]
                        nd += 1
                    lid[ko[r]] = nd - 1
                    keep[ue] = ko[r]
                    ue += 1
            keep[:ue].sort()
            for t in range(ue):
                uidx[t] = eidx[keep[t]]
                ulid[t] = lid[keep[t]]
            for u in range(ns):  # swap a document of j with a document of another pipeline
                x = lf[sel[u]]
                x2 = x * x
                lj = top2[j] if (x == top1[j] and cnt1[j] == 1) else top1[j]
                gx = G[j] - (1.0 if x > hj else 0.0)
                njl[:nd] = -1.0  # not computed yet (a cost is >= 0)
                for t in range(ue):
                    e = uidx[t]
                    ke = owner[e]
                    le = lf[e]
                    if not (le <= mj and x <= M[ke] and le != x):
                        continue
                    dl = ulid[t]
                    if njl[dl] >= 0 and not njl[dl] < best:  # j's cost for this partner length known, no better
                        continue
                    lk = top2[ke] if (le == top1[ke] and cnt1[ke] == 1) else top1[ke]
                    if cost1_floor(A[ke], B[ke], C[ke], D[ke], Q1[ke], Q[ke] - le * le + x2, S[ke] - le + x, N[ke],
                                   max(lk, x)) >= best:
                        continue
                    if njl[dl] < 0:
                        njl[dl] = cost1(aj, bj, cj, dj, qj, mj, rj, Q[j] - x2 + le * le, S[j] - x + le, N[j],
                                        max(lj, le), gx + (1.0 if le > hj else 0.0))
                    nj = njl[dl]
                    if not nj < best:
                        continue
                    hk = H[ke]
                    nk = cost1(A[ke], B[ke], C[ke], D[ke], Q1[ke], M[ke], R[ke], Q[ke] - le * le + x2, S[ke] - le + x,
                                N[ke],
                                max(lk, x), G[ke] - (1.0 if le > hk else 0.0) + (1.0 if x > hk else 0.0))
                    v = max(nj, nk)
                    if v < best:
                        best, bi, bk, be, bp = v, sel[u], ke, e, -1
            if bi < 0 and pairs and 2 <= nm <= 24:
                bi, bk, be, bp = pair_swap(j, mine[:nm], uidx[:ue], lf, owner, A, B, C, D, Q1, M, R, H, S, Q, N, G,
                                            top1, cnt1, top2, best)
        if bi < 0:
            return True
        ls_move(bi, bk, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load)
        if be >= 0:
            ls_move(be, j, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load)
        if bp >= 0:
            ls_move(bp, bk, owner, lf, A, B, C, D, Q1, M, R, H, S, Q, N, G, top1, cnt1, top2, load)
    return False
