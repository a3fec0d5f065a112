"""numpy's sums replayed in the planner's loops, float for float, and the per-pipeline figures built on them
(decision 115; the same pattern as kernels.py).

`np_sum` is numpy's pairwise summation of a contiguous float64 run (what np.sum and np.mean add), so that a loop
written once (compiled where numba is installed, plain Python otherwise) gives the same floats as the numpy
expressions it replaces: kernels_pack.pack_core (packing.pack), `mb_works` (packing.pipeline_time's per-micro-batch
work) and `pipe_reports` (select._reports' per-pipeline tokens and imbalance). `COMPILED` / `PLAIN` /
`loops()` as in kernels.py; the tests run both and compare them with numpy.
Import this module lazily (importing numba takes a second).
"""
from __future__ import annotations

import numpy as np

from tidal.planner.kernels import modes


def np_sum_block(x, lo, n):
    """numpy's pairwise sum of x[lo:lo + n] for n <= 128 (numpy's PW_BLOCKSIZE): sequential below 8 elements, else
    eight interleaved accumulators combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the rest."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += x[i]
        return res
    r0, r1, r2, r3 = x[lo], x[lo + 1], x[lo + 2], x[lo + 3]
    r4, r5, r6, r7 = x[lo + 4], x[lo + 5], x[lo + 6], x[lo + 7]
    i = 8
    m = n - n % 8
    while i < m:
        r0 += x[lo + i]
        r1 += x[lo + i + 1]
        r2 += x[lo + i + 2]
        r3 += x[lo + i + 3]
        r4 += x[lo + i + 4]
        r5 += x[lo + i + 5]
        r6 += x[lo + i + 6]
        r7 += x[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += x[lo + i]
        i += 1
    return res


def np_sum(x, lo, n):
    """float(np.sum(x[lo:lo + n])) for a contiguous float64 x, float for float: numpy's pairwise summation (blocks of
    at most 128 summed by np_sum_block; a longer run split at n2 = n // 2 rounded down to a multiple of 8, the two
    halves' sums added), started from the identity 0.0. Iterative (an explicit stack: numba cannot cache recursive
    functions). test_planner_packing checks it against np.sum in both modes."""
    if n <= 128:
        return 0.0 + np_sum_block(x, lo, n)
    slo = np.empty(64, np.int64)  # depth <= log2(n / 128) + 1
    sn = np.empty(64, np.int64)
    sstate = np.zeros(64, np.int64)  # 0: children not pushed yet, 1: both summed (their values on `vals`)
    vals = np.empty(64)
    nv = 0
    top = 0
    slo[0], sn[0], sstate[0] = lo, n, 0
    while top >= 0:
        a, m = slo[top], sn[top]
        if m <= 128:
            vals[nv] = np_sum_block(x, a, m)
            nv += 1
            top -= 1
        elif sstate[top] == 0:
            sstate[top] = 1
            m2 = m // 2
            m2 -= m2 % 8
            # right half below the left one, so the left is summed first
            slo[top + 1], sn[top + 1], sstate[top + 1] = a + m2, m - m2, 0
            slo[top + 2], sn[top + 2], sstate[top + 2] = a, m2, 0
            top += 2
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return 0.0 + vals[0]


def mb_works(lf, flat, sizes, a, b, d):
    """packing.pipeline_time's per-micro-batch work: micro-batch r is the next sizes[r] indices of `flat` (into the
    lengths lf; negative ones count from the end, as numpy's); its work is np.sum of a x^2 + b x + d over its lengths
    in their order (np_sum: the same float). An index out of range is an IndexError, as numpy's."""
    n = flat.size
    m = lf.size
    w = np.empty(n)
    for t in range(n):
        i = flat[t]
        if i < -m or i >= m:
            raise IndexError("micro-batch index out of range")
        x = lf[i if i >= 0 else i + m]
        w[t] = a * x * x + b * x + d
    out = np.empty(sizes.size)
    s = 0
    for r in range(sizes.size):
        out[r] = np_sum(w, s, sizes[r])
        s += sizes[r]
    return out


def pipe_reports(sub, mb_work, doc_end, mb_end, c):
    """select._reports' per-pipeline figures, pipeline j holding the documents [doc_end[j - 1], doc_end[j]) of `sub`
    (lengths) and the micro-batches [mb_end[j - 1], mb_end[j]) of `mb_work` (their work): its tokens;
    metrics.mb_imbalance of c + each micro-batch's work (max / mean, np_sum: numpy's sums; 1.0 for one micro-batch or
    an all-zero sum), the same floats. bad: a micro-batch time that is not finite or negative (metrics' TidalError)."""
    n_p = doc_end.size
    tok = np.zeros(n_p, np.int64)
    imb = np.ones(n_p)
    bad = False
    s = 0
    m0 = 0
    for j in range(n_p):
        tok[j] = sub[s:doc_end[j]].sum()
        if mb_end[j] - m0 > 1:
            t = c[j] + mb_work[m0:mb_end[j]]
            bad = bad or not ((t >= 0) & (t < np.inf)).all()
            tot = np_sum(t, 0, t.size)
            if tot != 0:  # a NaN or -inf is `bad` (the caller raises), so the max is the loop's
                imb[j] = t.max() / (tot / t.size)
        s = doc_end[j]
        m0 = mb_end[j]
    return tok, imb, bad


# the loops by the names their callers use, plain and compiled
_SUMS = {"np_sum_block": np_sum_block, "np_sum": np_sum, "mb_works": mb_works, "pipe_reports": pipe_reports}
PLAIN, COMPILED, loops = modes(_SUMS, {"np": np}, globals())
