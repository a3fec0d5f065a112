"""packing.pack's heuristic path on many pipelines in one call (issue 27: at 1024 GPUs pack_groups called `pack` on
hundreds of pipelines, about 25 us of Python each around a compiled call of a few us; the same pattern as kernels.py).

`pack_many` runs kernels_pack.pack_core on each group of a concatenated length array, so every group's packing and
time are pack_core's own, float for float. `fit_first` is the exchange's direct placement (exchange.Exchange._direct)
in one loop instead of about ten numpy calls (decision 142), `eject_pick` its ejection's pick (Exchange._eject;
decision 143), and `rebal_move` / `rebal_swap` the repair's rebalance searches (repair.Repair.rebalance; decision 146).
`COMPILED` / `PLAIN` / `loops()` as in kernels.py.
Import this module lazily (importing numba takes a second).
"""
from __future__ import annotations

import numpy as np

from tidal.planner import kernels_pack
from tidal.planner.kernels import modes

pack_core = kernels_pack.PLAIN.pack_core


def pack_many(flat, bounds, a, b, d, c, q, M, S, su):
    """pack_core(flat[bounds[g]:bounds[g + 1]], a[g], b[g], d[g], c[g], q[g], M[g], S[g], su[g]) for each group g
    (each of >= 2 sequences): (the indices of every group's packing, within its group, laid out at the group's place
    in `flat`; the micro-batch ends of group g at mb[bounds[g]:bounds[g] + nmb[g]]; nmb; est; the largest
    micro-batch's tokens per group)."""
    G = a.size
    ol_all = np.empty(flat.size, np.int64)
    mb = np.empty(flat.size, np.int64)
    nmb = np.empty(G, np.int64)
    est = np.empty(G)
    tmax = np.empty(G, np.int64)
    for g in range(G):
        s, e = bounds[g], bounds[g + 1]
        ol, ends, es, tm = pack_core(flat[s:e], a[g], b[g], d[g], c[g], q[g], M[g], S[g], su[g])
        ol_all[s:e] = ol
        nmb[g] = ends.size
        mb[s:s + ends.size] = ends
        est[g] = es
        tmax[g] = tm
    return ol_all, mb, nmb, est, tmax


def fit_first(t, w, op, room, lx, limit, off):
    """The pipeline p not in `off` with room[p] >= lx and t[p] + w[p] + op[p] < limit of least such value, the first
    on ties (numpy's argmin of that masked sum, float for float): (p, value), or (-1, inf) if none."""
    best, bv = -1, np.inf
    for p in range(t.size):
        if room[p] >= lx:
            v = t[p] + w[p] + op[p]
            if v < limit and v < bv and not (off == p).any():
                best, bv = p, v
    return best, bv


def eject_pick(ln, kk, w, k, need_tok, need_w, eject):
    """Exchange._eject's pick on one pipeline's documents sorted by (length, id) (lengths ln, micro-batch kk, work w),
    in one loop instead of about a dozen numpy calls (issue 27): (True, positions taken in order) or (False, empty)
    for None; the same positions, and each sum added in the same order (np.sum of at most 3 floats and np.cumsum add
    one at a time), so the same floats and searchsorted indices."""
    size = ln.size
    none = np.zeros(0, dtype=np.int64)
    for p in range(size):  # the shortest single document that does
        if w[p] > need_w and (need_tok <= 0 or (kk[p] == k and ln[p] >= need_tok)):
            one = np.empty(1, dtype=np.int64)
            one[0] = p
            return True, one
    take = np.empty(size, dtype=np.int64)
    nt = 0
    wsum = 0.0
    if need_tok > 0:
        ink = np.nonzero(kk == k)[0]
        n = np.searchsorted(np.cumsum(ln[ink]), need_tok) + 1  # the first prefix with >= need_tok tokens
        if n > min(ink.size, eject):
            return False, none
        for x in range(n):
            take[x] = ink[x]
            wsum += w[ink[x]]
        nt = n
    if not wsum > need_w:
        keep = np.ones(size, dtype=np.bool_)
        keep[take[:nt]] = False
        rest = np.nonzero(keep)[0]
        cumw = np.empty(rest.size + 1)
        cumw[0] = wsum
        cumw[1:] = w[rest]
        cumw = np.cumsum(cumw)[1:]  # added one at a time from wsum
        n = np.searchsorted(cumw, need_w, side="right") + 1  # the first prefix with > need_w work
        if n > rest.size:
            return False, none
        take[nt:nt + n] = rest[:n]
        nt += n
    if nt > eject:
        return False, none
    return True, take[:nt].copy()


def rebal_move(t, w, l, c, j, ij, aj, room, extra):
    """repair.Repair.rebalance's best move of a document of pipeline j (ij, in micro-batches aj) into the micro-batch
    with most room of another pipeline o: of max(t[j] without it, t[o] + extra[o] + w[o, i]) over the pairs where
    it fits, the least, the first in (o, position) order (numpy's argmin of that masked array, float for float):
    (value, o, position), or (inf, -1, -1)."""
    cnt = np.bincount(aj)  # documents per micro-batch
    bv, bo, bx = np.inf, -1, -1
    for o in range(t.size):
        if o == j:
            continue
        for x in range(ij.size):
            i = ij[x]
            if l[i] <= room[o]:
                out = t[j] - w[j, i]
                if cnt[aj[x]] == 1:
                    out = out - c[j]
                v = max(out, (t[o] + extra[o]) + w[o, i])
                if v < bv:
                    bv, bo, bx = v, o, x
    return bv, bo, bx


def rebal_swap(t, w, l, j, ij, aj, fj, K, po, fk):
    """Its best swap of document ij[r] (micro-batch aj[r], free tokens fj[aj[r]]) with K[k] of pipeline po[k] (its
    micro-batch's free tokens fk[k]), both micro-batches within MaxLen and the lengths different: of max(j's time,
    po[k]'s time) after the swap, the least, the first in (r, k) order (numpy's argmin, float for float): (value,
    r, k), or (inf, -1, -1)."""
    bv, br, bk = np.inf, -1, -1
    for r in range(ij.size):
        i = ij[r]
        for k in range(K.size):
            dl = l[K[k]] - l[i]
            if dl <= fj[aj[r]] and -dl <= fk[k] and dl != 0:
                v = max((t[j] - w[j, i]) + w[j, K[k]], (t[po[k]] - w[po[k], K[k]]) + w[po[k], i])
                if v < bv:
                    bv, br, bk = v, r, k
    return bv, br, bk


_BATCH = {"pack_many": pack_many, "fit_first": fit_first, "eject_pick": eject_pick, "rebal_move": rebal_move,
          "rebal_swap": rebal_swap}
if kernels_pack.COMPILED is not None:  # pack_many calls the compiled pack_core (bound before compiling)
    pack_core = kernels_pack.COMPILED.pack_core
PLAIN, COMPILED, loops = modes(_BATCH, {"np": np, "pack_core": kernels_pack.PLAIN.pack_core}, globals())
