"""The pipeline cost formula, written once (issue 27, decisions 85, 94, 96, 97): f(V) = (q + V) max(W / V + c,
c + w_max) for a pipeline of PP = q + 1 >= 2 stages, V c + W for one stage, and its minimum over integer V. Plain
Python on scalars, compiled into the numba loops by kernels.compile_pipecost (the same floats in both modes).
docs/planner.md, "One cost formula", lists each function, its callers and the tests.
"""

from __future__ import annotations

import math

import numpy as np

# q of a one-stage pipeline priced by Hydraulis Eq. 1 (PipeCost.eq1, decision 97): the smallest positive float. Every
# formula here reads q only through `q > 0` (does the slowest micro-batch count?), q + V and q * x; with EQ1_Q the
# test says yes while q + V == V for every V >= 1 and q * x is at most a subnormal, so f(V) = V max(W / V + c, c +
# w_max) (Eq. 1: V x the slowest micro-batch) and its minimiser is V_min, float for float, compiled and plain.
EQ1_Q = 5e-324


def pipe_coeffs(pipes):
    """(a, b, c, d) of each pipeline (bounds.PipeCost) as four arrays, for the numpy and compiled loops (called from
    Python, not compiled)."""
    return tuple(np.array([getattr(p, k) for p in pipes]) for k in "abcd")


def stage_q(pp, eq1=False):
    """The q the formulas take for a pipeline of `pp` stages: pp - 1 (a float), or EQ1_Q for a one-stage pipeline
    priced by Hydraulis Eq. 1 (`eq1`), whose slowest micro-batch counts; a one-stage pipeline otherwise sums its
    micro-batches (decision 94)."""
    return EQ1_Q if eq1 and pp == 1 else float(pp - 1)


def pipe_value(q, c, W, wm, v):
    """f(v) = (q + v) * max(W / v + c, c + wm) for q > 0; v (W / v + c) for q = 0 (one stage: the sum of its
    micro-batches, decision 94)."""
    return (q + v) * max(W / v + c, c + (wm if q > 0 else 0.0))


def packed_value(q, c, W, top, v):
    """The time of a packed pipeline of v micro-batches of total work W whose slowest micro-batch takes `top` (c + its
    work): (q + v) * top for q > 0, v (W / v + c) (their sum, = pipe_value) for q = 0 (decision 94)."""
    if q > 0:
        return (q + v) * top
    return v * (W / v + c)


def v_opt(q, c, W, wm):
    """The continuous minimiser of f over v > 0: min(sqrt(q W / c), W / wm); 0 when q = 0 (f grows with v), inf when
    c = 0 < q; the second term only when wm > 0."""
    if q == 0:
        v0 = 0.0
    elif c > 0:
        v0 = math.sqrt(q * W / c)
    else:
        v0 = math.inf
    if wm > 0:
        v0 = min(v0, W / wm)
    return v0


def best_v(q, c, W, wm, vmin, vmax):
    """(V, f(V)) minimising f over integer V in [vmin, vmax] (vmin <= vmax); ties go to the lower V."""
    bv = vmin
    best = pipe_value(q, c, W, wm, vmin)
    v0 = v_opt(q, c, W, wm)
    if math.isfinite(v0):
        lo = min(vmax, max(vmin, math.floor(v0)))
        hi = min(vmax, max(vmin, math.ceil(v0)))
        f = pipe_value(q, c, W, wm, lo)
        if f < best:
            bv, best = lo, f
        f = pipe_value(q, c, W, wm, hi)
        if f < best:
            bv, best = hi, f
    f = pipe_value(q, c, W, wm, vmax)
    if f < best:
        bv, best = vmax, f
    return bv, best


def bound_value(q, c, M, W, tok, wm, cnt):
    """bounds.pipeline_bound's value (before its slack) for sums: work W, `tok` tokens, longest work wm, `cnt`
    documents, MaxLen M: min of f over V in [ceil(tok / M), cnt] (at least 1)."""
    vmin = max(1, -(-tok // M))
    return best_v(q, c, W, wm, vmin, max(vmin, cnt))[1]


def greedy_cost(q, c, M, W, tok, wm, cnt, g):
    """The dispatch greedy's capacity-aware cost of one pipeline: min of f over V in [V_min, cnt], V_min =
    max(1, ceil(tok / M), g) (g documents longer than M / 2 need a micro-batch each). With q = 0, f grows with V, so
    its value at V_min."""
    vmin = max(1, -(-tok // M), g)
    if q == 0:
        return pipe_value(q, c, W, wm, vmin)
    return best_v(q, c, W, wm, vmin, max(vmin, cnt))[1]


def add_cost(c, q, M, Wj, Tj, Lj, Uj, Gj, x, wx, big):
    """greedy_cost of pipeline j (sums Wj, Tj, longest work Lj, count Uj, long documents Gj) with one more document
    of length x and work wx (big: x > M / 2)."""
    return greedy_cost(q, c, M, Wj + wx, Tj + x, Lj if Lj > wx else wx, Uj + 1, Gj + big)


def cost1(a, b, c, d, q1, m, r, Q, S, N, lmax, G):
    """The dispatch's capacity-aware cost of one pipeline (kernels.pipe_loads, local_search): a share with sum
    l^2 = Q, sum l = S, count N, longest lmax and G documents longer than MaxLen m / 2, work w(l) = a l^2 + b l + d;
    min of f over V in [max(1, ceil(S / m), G), max(that, N)], from the floor and ceiling of v_opt computed as
    min(sqrt(W) r, W / w_max) with r = sqrt(q1 / c) per pipeline (precomputed; a huge finite number when
    c = 0 < q1); 0 when empty."""
    if not N > 0:
        return 0.0
    W = a * Q + b * S + d * N
    wm = a * lmax * lmax + b * lmax + d
    vmin = max(max(1.0, np.ceil(S / m)), G)
    vmax = max(vmin, N)
    v0 = min(np.sqrt(W) * r, W / max(wm, 1e-300))
    lo = min(max(np.floor(v0), vmin), vmax)
    hi = min(max(np.ceil(v0), vmin), vmax)
    return min(pipe_value(q1, c, W, wm, lo), pipe_value(q1, c, W, wm, hi))


def cost1_floor(a, b, c, d, q1, m, Q, S, N, lmax, G):
    """A lower bound on the float value of cost1(a, b, c, d, q1, m, r, Q, S, N, lmax, G) for N >= 1, whatever r:
    the local search skips cost1 where this cannot beat its best move (kernels.local_search), so it must hold in
    floating point. Every V cost1 tries is >= V_min = max(1, ceil(S / m), G) (the same float expression), and
    f(V) >= g(V) = (q + V)(W / V + c), convex in V with its minimum at sqrt(q W / c): min over V >= V_min is
    (sqrt(W) + sqrt(q c))^2 when that point is >= V_min, else g(V_min); f(V) >= (q + V_min)(c + w_max) for q > 0;
    f(V) >= W (c = 0 < q); f = W + V c >= W + V_min c for q = 0. With rounding to nearest each holds for the computed
    values up to a few ulps (the same float W as cost1's; no subtraction), which the factor 1 - 1e-12 covers.
    The exact bound does not fall when W, w_max or V_min grow, so neither does it when Q, S, lmax or G grow (float
    sums and products of non-negative terms are monotone too): one computed value also bounds cost1 at every larger
    input (its exact bound is no lower, and the factor covers both roundings), which lets the local search stop a
    scan over partner lengths (decision 117)."""
    W = a * Q + b * S + d * N
    vmin = max(max(1.0, np.ceil(S / m)), G)
    if q1 > 0:
        lo = (q1 + vmin) * (c + (a * lmax * lmax + b * lmax + d))
        if c > 0:
            if q1 * W >= c * vmin * vmin:  # g's minimum over real V > 0 is at V >= V_min
                r = math.sqrt(W) + math.sqrt(q1 * c)
                lo = max(lo, r * r)
            else:
                lo = max(lo, (q1 + vmin) * (W / vmin + c))
        else:
            lo = max(lo, W)
    else:
        lo = W + vmin * c
    return lo * (1 - 1e-12)
