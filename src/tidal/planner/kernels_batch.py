"""packing.pack's heuristic path on many pipelines in one call (issue 27: at 1024 GPUs pack_groups called `pack` on
hundreds of pipelines, about 25 us of Python each around a compiled call of a few us; the same pattern as kernels.py).

`pack_many` runs kernels_pack.pack_core on each group of a concatenated length array, so every group's packing and
time are pack_core's own, float for float. `fit_first` is the exchange's direct placement (exchange.Exchange._direct)
in one loop instead of about ten numpy calls (decision 142). `COMPILED` / `PLAIN` / `loops()` as in kernels.py.
Import this module lazily (importing numba takes a second).
"""
from __future__ import annotations

import types

import numpy as np

from tidal.planner import kernels_pack
from tidal.planner.kernels import compile_loops, plain

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
            if v < limit and v < bv:
                ok = True
                for q in off:
                    if q == p:
                        ok = False
                if ok:
                    best, bv = p, v
    return best, bv


_BATCH = {"pack_many": pack_many, "fit_first": fit_first}
PLAIN = plain(_BATCH, {"np": np, "pack_core": kernels_pack.PLAIN.pack_core})
if kernels_pack.COMPILED is not None:  # pack_many calls the compiled pack_core (bound before compiling)
    pack_core = kernels_pack.COMPILED.pack_core

COMPILED = compile_loops(_BATCH, globals())


def loops() -> types.SimpleNamespace:
    """pack_many compiled where numba is installed, else plain Python (the same source)."""
    return COMPILED if COMPILED is not None else PLAIN
