"""polish's rounds, written once (decisions 60, 117, 120, 121; the same pattern as kernels.py).

`polish_rounds` is polish.polish's whole search in one call: `COMPILED` (numba.njit, cached on disk) where numba is
installed, `PLAIN` the same source as plain Python, `loops()` the first available. Each value is the float its former
numpy expression gave (same operations in the same order; sums in index order as np.bincount adds them; the first
least entry in the row-major order of np.argmin), so the moves, plans and estimates are the same; the tests compare
the two modes float for float. Import this module lazily (importing numba takes a second).
"""
from __future__ import annotations

import numpy as np

from tidal.planner.kernels import modes


def polish_rounds(lf, A, B, C, D, Q1, M, n_mbs, flat, sizes, mb_pipe, doc_mb, alive, changed, target, rounds,
                  max_docs, min_gain, light):
    """Up to `rounds` rounds of polish (module doc of polish.py) on a plan whose pipeline j has n_mbs[j] micro-batches
    (in pipeline order), micro-batch r holding the next sizes[r] documents of `flat`. Fills mb_pipe (each micro-batch's
    pipeline) and doc_mb (each document's micro-batch; the last one listing it) and returns the first document in no
    micro-batch, before any round; else -1 after the rounds, which move documents in doc_mb, clear `alive` (all True
    on entry) of micro-batches a move empties, and set `changed` of the pipelines they touch. An index out of range
    is an IndexError (negative ones count from the end), as numpy's."""
    n, n_mb, P = lf.size, mb_pipe.size, A.size
    mb_pipe[:] = np.repeat(np.arange(P), n_mbs)
    doc_mb[:] = -1
    t = 0
    for m in range(n_mb):
        for _ in range(sizes[m]):
            i = flat[t]
            if i < -n or i >= n:
                raise IndexError("micro-batch index out of range")
            doc_mb[i if i >= 0 else i + n] = m
            t += 1
    for i in range(n):
        if doc_mb[i] < 0:
            return i
    dp = mb_pipe[doc_mb]  # each document's pipeline
    # c + the work where it is, summed per micro-batch in document order (np.bincount adds one weight at a time)
    mb_t = C[mb_pipe] + np.bincount(doc_mb, weights=A[dp] * lf * lf + B[dp] * lf + D[dp], minlength=n_mb)
    mb_tok = np.bincount(doc_mb, weights=lf, minlength=n_mb)
    cnt = np.bincount(doc_mb, minlength=n_mb)
    top1, top2, V, tot, time = np.empty(P), np.empty(P), np.empty(P), np.empty(P), np.empty(P)
    arg = np.empty(P, np.int64)
    sel, xs, wj, new_j = np.empty(max_docs, np.int64), np.empty(max_docs), np.empty(max_docs), np.empty(max_docs)
    near = np.zeros(P, np.bool_)
    for _ in range(rounds):
        # each pipeline's slowest live micro-batch (the first at the top), the second, count, sum and time
        top1[:], top2[:], V[:], tot[:], arg[:] = -np.inf, -np.inf, 0.0, 0.0, n_mb
        for m in range(n_mb):
            if alive[m]:
                p = mb_pipe[m]
                V[p] += 1.0
                tot[p] += mb_t[m]  # one stage: the sum (decision 94)
                if mb_t[m] > top1[p]:
                    top1[p] = mb_t[m]
        for m in range(n_mb):
            p = mb_pipe[m]
            if alive[m] and arg[p] == n_mb and mb_t[m] == top1[p]:
                arg[p] = m
        for m in range(n_mb):
            p = mb_pipe[m]
            if alive[m] and m != arg[p] and mb_t[m] > top2[p]:
                top2[p] = mb_t[m]
        j = 0
        for p in range(P):
            time[p] = 0.0 if V[p] <= 0 else (Q1[p] + V[p]) * max(top1[p], 0.0) if Q1[p] > 0 else tot[p]
            if time[p] > time[j]:
                j = p
        tj = time[j]
        if tj <= target:
            break
        ms = arg[j]
        mine = np.nonzero(doc_mb == ms)[0]
        nm = mine.size
        if nm == 0:
            break
        order = np.argsort(-lf[mine], kind="mergesort")  # longest first, ties by index (stable)
        ns = min(max_docs, nm)
        fj = Q1[j] + V[j]
        sec = max(top2[j], 0.0)
        for a in range(ns):
            sel[a] = mine[order[a]]
            x = lf[sel[a]]
            xs[a] = x
            wj[a] = A[j] * x * x + B[j] * x + D[j]
            if Q1[j] > 0:
                new_j[a] = ((fj - 1) * sec if fj - 1 > Q1[j] else 0.0) if nm == 1 else fj * max(sec, mb_t[ms] - wj[a])
            else:
                new_j[a] = tj - wj[a] - (C[j] if nm == 1 else 0.0)
        best_val, bd, bm, be = tj * (1 - min_gain), -1, -1, -1
        if Q1[j] > 0 and nm > 1 and fj * sec >= best_val:
            # no move or swap can win: j's new time is fj * max(sec, .) >= fj * sec (fj > 0, the same float product
            # as new_j's and nj's), and every entry is the max of it and the partner's (decision 120)
            break
        # moves: a document of ms into any live micro-batch of another pipeline with token room (the first least)
        v_best, va, vm = np.inf, -1, -1
        for a in range(ns):
            x = xs[a]
            for m in range(n_mb):
                k = mb_pipe[m]
                if not alive[m] or k == j or mb_tok[m] + x > M[k]:
                    continue
                wk = A[k] * (x * x) + B[k] * x + D[k]
                other = top2[k] if m == arg[k] else top1[k]
                nk = (Q1[k] + V[k]) * max(other, mb_t[m] + wk) if Q1[k] > 0 else time[k] + wk
                v = max(new_j[a], nk)
                if v < v_best:
                    v_best, va, vm = v, a, m
        if v_best < best_val:
            best_val, bd, bm = v_best, sel[va], vm
        # swaps: a document of ms with any document of another pipeline (on large steps, of the `light` least loaded
        # pipelines only, as in the dispatch's local search: that is where the bottleneck's work can go)
        few = n > 256 and light < P
        if few:
            near[:] = False
            rank = np.argsort(time, kind="mergesort")
            for r in range(light):
                near[rank[r]] = True
            near[j] = False
        # a partner can win with some document of ms only if each side's least new time over the rows is below
        # best_val: j's grows with the partner's work on j from one least base, the partner's with x (least at the
        # shortest, xs[ns - 1]); the same float operations as the entries (decision 117)
        base = np.inf
        for a in range(ns):
            base = min(base, (mb_t[ms] - wj[a]) if Q1[j] > 0 else (tj - wj[a]))
        x1 = xs[ns - 1]
        s_best, sa, se = np.inf, ns, -1
        for e in range(n):
            me = doc_mb[e]
            k = mb_pipe[me]
            if (not near[k]) if few else k == j:
                continue
            le = lf[e]
            wje = A[j] * le * le + B[j] * le + D[j]
            wke = A[k] * le * le + B[k] * le + D[k]
            other = top2[k] if me == arg[k] else top1[k]
            fk = Q1[k] + V[k]
            njc = fj * max(sec, base + wje) if Q1[j] > 0 else base + wje
            wx1 = A[k] * (x1 * x1) + B[k] * x1 + D[k]
            nkc = fk * max(other, mb_t[me] - wke + wx1) if Q1[k] > 0 else time[k] - wke + wx1
            if not (njc < best_val and nkc < best_val):
                continue
            for a in range(ns):
                x = xs[a]
                if mb_tok[ms] - x + le > M[j] or mb_tok[me] - le + x > M[k] or le == x:
                    continue
                nj = fj * max(sec, mb_t[ms] - wj[a] + wje) if Q1[j] > 0 else tj - wj[a] + wje
                wkd = A[k] * (x * x) + B[k] * x + D[k]
                nk = fk * max(other, mb_t[me] - wke + wkd) if Q1[k] > 0 else time[k] - wke + wkd
                v = max(nj, nk)
                if v < s_best or (v == s_best and a < sa):  # np.argmin's first least in (row, partner) order
                    s_best, sa, se = v, a, e
        if s_best < best_val:
            best_val, bd, bm, be = s_best, sel[sa], doc_mb[se], se
        if bd < 0:
            break
        for doc, src, dst in ((bd, ms, bm), (be, bm, ms)):  # the move, then the swap's second half
            if doc < 0:
                continue
            ps, pd, x = mb_pipe[src], mb_pipe[dst], lf[doc]
            mb_t[src] -= A[ps] * x * x + B[ps] * x + D[ps]
            mb_tok[src] -= x
            mb_t[dst] += A[pd] * x * x + B[pd] * x + D[pd]
            mb_tok[dst] += x
            doc_mb[doc] = dst
            cnt[src] -= 1
            cnt[dst] += 1
            alive[dst] = True  # a swap refills the micro-batch its first half emptied
            alive[src] = cnt[src] > 0
        changed[j] = changed[mb_pipe[bm]] = True
    return -1


PLAIN, COMPILED, loops = modes({"polish_rounds": polish_rounds}, {"np": np}, globals())
