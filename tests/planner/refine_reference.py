"""The packer's move/swap rounds before decision 121 (main e799719): every swap partner visited in index order. Kept as
the reference that kernels_pack.refine (partners by micro-batch and length, between two monotone bounds) must equal
move for move. Plain Python."""

import numpy as np


def refine_reference(bin_of, l_, w, T, tok, V, M, rounds, max_docs):
    """Move/swap sequences off the slowest micro-batch while that strictly lowers it (in place; T: micro-batch times,
    tok: token counts), at most `rounds` rounds. Candidates: the first document of each distinct length of the slowest
    micro-batch, longest first, at most `max_docs`; for each, moves to micro-batches in index order, then swaps with
    every other document in index order; the first strict best wins."""
    n = l_.size
    mine = np.empty(n, np.int64)
    others = np.empty(n, np.int64)
    for _ in range(rounds):
        b = 0
        for k in range(1, V):
            if T[k] > T[b]:
                b = k
        tb = T[b]
        nm = 0
        no = 0
        for i in range(n):
            if bin_of[i] == b:
                mine[nm] = i
                nm += 1
            else:
                others[no] = i
                no += 1
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
            for q in range(no):
                e = others[q]
                le = l_[e]
                ke = bin_of[e]
                if tok[b] - x + le <= M and tok[ke] - le + x <= M and le != x:
                    v = max(tb - wx + w[e], T[ke] - w[e] + wx)
                    if v < best:
                        best, bi, bk, be = v, i, ke, e
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
