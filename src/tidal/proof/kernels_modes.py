"""The mode bound's loops, written once (decisions 67, 102, 112; docs/planner.md, "Mode-aware bound"): its per-T
arrays and the price search (multiplicative updates, then line searches along each pair of classes). Every row is
checked as computed, so a verdict True is a valid certificate. `COMPILED` (numba) where installed, `PLAIN` the same
source as plain Python, `loops()` the first available; import lazily (importing numba takes a second).
"""
from __future__ import annotations

import types

import numpy as np

from tidal.planner.kernels import compile_loops, plain


def price_gap(U, wt, cnt, y):
    """sum_i wt_i min_k y_k U[i, k] over sum_k y_k cnt_k (inf entries of U skipped)."""
    K = U.shape[1]
    lhs = 0.0
    for i in range(U.shape[0]):
        m = np.inf
        for k in range(K):
            if np.isfinite(U[i, k]):
                v = y[k] * U[i, k]
                if v < m:
                    m = v
        lhs += m * wt[i]
    rhs = 0.0
    for k in range(K):
        rhs += y[k] * cnt[k]
    return lhs / max(rhs, 1e-300)


def pair_search(U, wt, cnt, y, j, k, iters):
    """y (on the simplex) with the price of classes j and k redistributed (y_j + y_k = a fixed) to maximise g along
    that line: the share s = y_j / a where the right derivative of g changes sign, found by `iters` bisection steps.
    Per document, with m the least price-weighted cost over the other classes, its term min(s a U_j, (1 - s) a U_k, m)
    has slope a U_j while s < slo, -a U_k while s >= shi, 0 in between."""
    a = y[j] + y[k]
    out = y.copy()
    if a <= 0.0:
        return out
    B, K = U.shape[0], U.shape[1]
    slo = np.empty(B)
    shi = np.empty(B)
    for i in range(B):
        m = np.inf
        for h in range(K):
            if h != j and h != k and np.isfinite(U[i, h]):
                v = y[h] * U[i, h]
                if v < m:
                    m = v
        uj, uk = U[i, j], U[i, k]
        fj, fk = np.isfinite(uj), np.isfinite(uk)
        s1 = m / (a * uj) if (fj and uj > 0.0 and np.isfinite(m)) else np.inf
        s2 = 1.0 - m / (a * uk) if (fk and uk > 0.0 and np.isfinite(m)) else -np.inf
        if fj and fk:
            s3 = uk / (uj + uk) if uj + uk > 0.0 else 0.5
            slo[i] = min(s1, s3)
            shi[i] = max(s2, s3)
        elif fj:
            slo[i], shi[i] = s1, np.inf
        elif fk:
            slo[i], shi[i] = -np.inf, s2
        else:
            slo[i], shi[i] = -np.inf, np.inf
    lo, hi = 0.0, 1.0
    for it in range(iters + 2):
        s = 0.0 if it == 0 else (1.0 if it == 1 else 0.5 * (lo + hi))
        d = -(cnt[j] - cnt[k])
        for i in range(B):
            if s < slo[i]:
                d += wt[i] * U[i, j]
            elif s >= shi[i]:
                d -= wt[i] * U[i, k]
        if it == 0:
            if d <= 0.0:
                hi = 0.0
                break
        elif it == 1:
            if d > 0.0:
                lo = 1.0
                break
        elif d > 0.0:
            lo = s
        else:
            hi = s
    s = lo if lo == 1.0 else hi
    out[j] = s * a
    out[k] = (1.0 - s) * a
    return out


def mode_violated(U, wt, cnt, Y, rounds, sweeps, found):
    """modes.violated's price search: does some price row y certify
    sum_i min_k y_k U[i, k] wt[i] > (1 + 1e-9) sum_k y_k cnt[k]? The rows are Y's (R x K), then `rounds` multiplicative
    updates of the best row (the one with the largest ratio of the two sides): each class's price is raised by its
    argmin-assigned cost over its pipeline count (clipped to [0.25, 4]) to the powers 0.25, 0.5 and 1 (damped by
    1 + it / 4), giving three normalised rows; then `sweeps` sweeps of pair_search over every pair of classes from the
    best row seen. Infinite U[i, k]: document i does not fit class k. Any row found is a valid certificate (the
    inequality is checked as computed); it is written into `found` (K), where a search at a nearby T starts."""
    K = U.shape[1]
    B = U.shape[0]
    expo = np.array([0.25, 0.5, 1.0])
    ys = Y.copy()
    top, ytop = -np.inf, Y[0].copy()
    for it in range(rounds + 1):
        best, rb = -np.inf, 0
        for r in range(ys.shape[0]):
            gap = price_gap(U, wt, cnt, ys[r])
            if gap > 1 + 1e-9:
                found[:] = ys[r]
                return True
            if gap > best:
                best, rb = gap, r
        if best > top:
            top, ytop = best, ys[rb].copy()
        if it == rounds:
            break
        load = np.zeros(K)
        for i in range(B):
            m, kb = np.inf, 0
            for k in range(K):
                if np.isfinite(U[i, k]):
                    v = ys[rb, k] * U[i, k]
                    if v < m:
                        m, kb = v, k
            load[kb] += U[i, kb] * wt[i]
        ratio = np.empty(K)
        for k in range(K):
            ratio[k] = min(max((load[k] + 1e-30) / max(cnt[k], 1e-30), 0.25), 4.0)
        nxt = np.empty((3, K))
        for j in range(3):
            tot = 0.0
            for k in range(K):
                nxt[j, k] = ys[rb, k] * ratio[k] ** (expo[j] / (1 + it / 4))
                tot += nxt[j, k]
            for k in range(K):
                nxt[j, k] = nxt[j, k] / tot
        ys = nxt
    y = ytop
    for _ in range(sweeps):
        for j in range(K - 1):
            for k in range(j + 1, K):
                y = pair_search(U, wt, cnt, y, j, k, 30)
                if price_gap(U, wt, cnt, y) > 1 + 1e-9:
                    found[:] = y
                    return True
    return False


def mode_arrays(T, C, P, tau, cap):
    """modes.mode_arrays into tau and cap (K x VB, VB = tau.shape[1]; the last mode merged): per class k with
    q = P_k - 1 and v = 1 .. VB, tau = T / (q + v) and C_v = v (tau - c) when q > 0, else (one stage, decision 94)
    tau = T - (v - 1) c and C_v = T - v c; the merged mode's C is sup over real v >= VB of v (T / (q + v) - c):
    (sqrt T - sqrt(q c))^2 where the unconstrained maximiser sqrt(T q / c) - q exceeds VB, T when c = 0."""
    K, VB = tau.shape[0], tau.shape[1]
    for k in range(K):
        q = P[k] - 1.0
        c = C[k]
        for j in range(VB):
            v = j + 1.0
            if q > 0:
                t = T / (q + v)
                tau[k, j] = t
                cap[k, j] = v * (t - c)
            else:
                tau[k, j] = T - (v - 1.0) * c
                cap[k, j] = T - v * c
        vstar = np.sqrt(T * (P[k] - 1.0) / c) - (P[k] - 1.0) if c > 0 else np.inf
        if not np.isfinite(vstar):
            cap[k, VB - 1] = T
        elif vstar > VB:
            d = np.sqrt(T) - np.sqrt((P[k] - 1.0) * c)
            cap[k, VB - 1] = d * d


def mode_thetas(T, C, P, M, rho, cap, th):
    """modes.infeasible's theta row into th (K x VB): per mode work (1.0) where a pipeline filled with the step's
    mean document (work per token rho) would exhaust its work capacity first (rho v M >= C_v), else tokens (0.0); the
    merged mode work (1.0), or for a one-stage class the row (w + c l / M) / T (2.0) where VB M (rho + c / M) < T
    (decision 102: in every mode v, W + v c <= T and tokens <= v M, so W + c tokens / M <= T). (All-work, and tokens
    in mode 1 only, were tried as well: on the issue-9 cells they proved nothing more and doubled the cost.)"""
    K, VB = th.shape[0], th.shape[1]
    for k in range(K):
        for j in range(VB - 1):
            th[k, j] = 1.0 if rho[k] * (j + 1.0) * M[k] >= cap[k, j] else 0.0
        th[k, VB - 1] = 1.0
        if P[k] == 1.0 and VB * M[k] * (rho[k] + C[k] / M[k]) < T:
            th[k, VB - 1] = 2.0


def mode_costs(T, C, M, cw, w, l, tau, cap, th, out):
    """modes.infeasible's costs for a theta row th (K x VB) into out (B x K): u_ik(T), inf where document i fits
    class k in no mode. Its eligible modes are 1 .. n (c + w_ik <= tau_v (1 + 1e-12); tau falls with v), so u_ik is
    the least of w_ik over the largest C_v among the work modes (th 1, C_v >= 0) up to n, l_i over (the largest token
    mode up to n) M_k, and, where a mode up to n is marked 2 and T > 0, (w_ik + c l_i / M_k) / T (decision 102)."""
    K, VB, B = tau.shape[0], tau.shape[1], cw.shape[0]
    cb = np.empty(VB)
    vb = np.empty(VB)
    hs = np.zeros(VB, dtype=np.bool_)
    for k in range(K):
        run_c, run_v, run_h, any2 = -np.inf, 0.0, False, False
        for j in range(VB):
            t = th[k, j]
            if t > 0.5 and t < 1.5 and cap[k, j] >= 0.0 and cap[k, j] > run_c:
                run_c = cap[k, j]
            if t < 0.5 and cap[k, j] >= 0.0 and j + 1.0 > run_v:
                run_v = j + 1.0
            if t > 1.5:
                run_h, any2 = True, True
            cb[j], vb[j], hs[j] = run_c, run_v, run_h
        two = T > 0 and any2
        for i in range(B):
            x = cw[i, k]
            n = 0
            while n < VB and x <= tau[k, n] * (1 + 1e-12):
                n += 1
            if n == 0:
                out[i, k] = np.inf
                continue
            cbest, vbest, wi = cb[n - 1], vb[n - 1], w[i, k]
            work = np.inf  # w > 0 needs a positive capacity; w = 0 fits any work mode (0 / 0 counts as 0)
            if wi > 0 and cbest > 0:
                work = wi / cbest
            elif wi <= 0 and cbest > -np.inf:
                work = 0.0
            tok = l[i] / (vbest * M[k]) if vbest > 0 else np.inf
            u = tok if tok <= work else work
            if two and hs[n - 1]:
                r = (wi + C[k] * l[i] / M[k]) / T
                if r <= u:
                    u = r
            out[i, k] = u


def mode_infeasible(T, C, P, M, rho, cw, w, l, wt, cnt, Y, rounds, sweeps, found, tau, cap, th, U):
    """modes.infeasible at T in one call: mode_arrays, mode_thetas and mode_costs into tau, cap, th and U
    (B x K); 1 when some document fits no class at T (a row of U whose np.min is not finite), else with one class 2
    (the caller compares U's sum with the pipeline count), else 1 when mode_violated finds a certificate, 0 if not."""
    mode_arrays(T, C, P, tau, cap)
    mode_thetas(T, C, P, M, rho, cap, th)
    mode_costs(T, C, M, cw, w, l, tau, cap, th, U)
    K = U.shape[1]
    for i in range(U.shape[0]):
        m = U[i, 0]
        for k in range(1, K):
            if not np.isnan(m) and (np.isnan(U[i, k]) or U[i, k] < m):
                m = U[i, k]
        if not np.isfinite(m):
            return 1
    if K == 1:
        return 2
    return 1 if mode_violated(U, wt, cnt, Y, rounds, sweeps, found) else 0


_MODES = {"price_gap": price_gap, "pair_search": pair_search, "mode_violated": mode_violated,
          "mode_arrays": mode_arrays, "mode_thetas": mode_thetas, "mode_costs": mode_costs,
          "mode_infeasible": mode_infeasible}
PLAIN = plain(_MODES, {"np": np})

COMPILED = compile_loops(_MODES, globals())


def loops() -> types.SimpleNamespace:
    """The mode bound's price search: compiled where numba is installed, else plain Python (the same source)."""
    return COMPILED if COMPILED is not None else PLAIN
