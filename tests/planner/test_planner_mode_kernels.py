"""The mode bound's per-T arrays as one-source kernels (kernels_modes.mode_arrays, mode_thetas, mode_costs; decision
112): compiled and plain Python, each equal float for float to the numpy expressions they replaced (kept here as the
references); the price search with two classes against the exact two-class maximum (decision 122); and
modes.infeasible's one call (kernels_modes.mode_infeasible, decision 124) against those kernels one by one."""

import numpy as np
import pytest
from planner_synth import open_bounds

from tidal.proof import kernels_modes as km
from tidal.proof.modes import SWEEPS, VB, _step_arrays, infeasible, mode_arrays, violated

pytestmark = pytest.mark.unit

MODES = [km.PLAIN] + ([km.COMPILED] if km.COMPILED is not None else [])


def _thetas(T, step, cap, loops):
    _, _, _, M, rho, C, P = step
    th = np.empty((C.size, VB))
    loops.mode_thetas(float(T), C, P, M, rho, cap, th)
    return th


def _costs(T, step, th, tau, cap, loops):
    cw, w, l_, M, _, C, _ = step
    out = np.empty((l_.size, C.size))
    loops.mode_costs(float(T), C, M, cw, w, l_, tau, cap, np.ascontiguousarray(th, np.float64), out)
    return out


def _mode_arrays_ref(T, C, P):
    v = np.arange(1, VB + 1, dtype=np.float64)[None, :]
    q, c = (P - 1.0)[:, None], C[:, None]
    tau = np.where(q > 0, T / (q + v), T - (v - 1.0) * c)
    cap = np.where(q > 0, v * (tau - c), T - v * c)
    with np.errstate(divide="ignore", invalid="ignore"):
        vstar = np.where(C > 0, np.sqrt(T * (P - 1.0) / np.where(C > 0, C, 1.0)) - (P - 1.0), np.inf)
    cap[:, -1] = np.where(~np.isfinite(vstar), T,
                          np.where(vstar > VB, (np.sqrt(T) - np.sqrt((P - 1.0) * C)) ** 2, cap[:, -1]))
    return tau, cap


def _thetas_ref(T, sb, cap):
    ca, rho = sb.ca, _step_arrays(sb)[4]
    v = np.arange(1, VB + 1, dtype=np.float64)[None, :]
    th = (rho[:, None] * v * ca.M[:, None] >= cap).astype(np.float64)
    th[:, -1] = 1.0
    th[(ca.P == 1.0) & (VB * ca.M * (rho + ca.C / ca.M) < T), -1] = 2.0
    return th


def _costs_ref(T, sb, th, tau, cap):
    ca, (cw, w, l_, M) = sb.ca, _step_arrays(sb)[:4]
    v = np.arange(1, VB + 1, dtype=np.float64)
    out = np.empty((l_.size, ca.C.size))
    for k in range(ca.C.size):
        n = np.searchsorted(-(tau[k] * (1 + 1e-12)), -cw[:, k], side="right")
        last = np.maximum(n - 1, 0)
        allowed = cap[k] >= 0.0
        cbest = np.maximum.accumulate(np.where((th[k] > 0.5) & (th[k] < 1.5) & allowed, cap[k], -np.inf))[last]
        vbest = np.maximum.accumulate(np.where((th[k] < 0.5) & allowed, v, 0.0))[last]
        with np.errstate(divide="ignore", invalid="ignore"):
            work = np.where(w[:, k] > 0, np.where(cbest > 0, w[:, k] / cbest, np.inf),
                            np.where(cbest > -np.inf, 0.0, np.inf))
            tok = np.where(vbest > 0, l_ / (vbest * M[k]), np.inf)
        u = np.minimum(work, tok)
        if T > 0 and np.any(th[k] > 1.5):
            has = np.maximum.accumulate(th[k] > 1.5)[last]
            u = np.minimum(u, np.where(has, (w[:, k] + ca.C[k] * l_ / M[k]) / T, np.inf))
        out[:, k] = np.where(n > 0, u, np.inf)
    return out


def _two_class_ratio(U, wt, cnt):
    """The exact max over y = (t, 1 - t) of sum_i wt_i min_k y_k U_ik / (y . cnt) (inf entries skipped): the
    numerator is concave piecewise-linear, so the max is at a breakpoint u_i2 / (u_i1 + u_i2) or an end."""
    u1, u2 = U[:, 0], U[:, 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        ts = np.where(np.isfinite(u1) & np.isfinite(u2) & (u1 + u2 > 0), u2 / (u1 + u2), 0.0)
    best = 0.0
    for t in np.concatenate([[0.0, 1.0], ts]):
        a, b = t * u1, (1 - t) * u2
        a = np.where(np.isfinite(u1), a, np.inf)
        b = np.where(np.isfinite(u2), b, np.inf)
        m = np.minimum(a, b)
        best = max(best, float(np.where(np.isfinite(m), m, 0.0) @ wt) / max(t * cnt[0] + (1 - t) * cnt[1], 1e-300))
    return best


def test_mode_arrays_thetas_and_costs_equal_the_numpy_expressions_in_both_modes():
    rng = np.random.default_rng(11)
    twos = merged = 0
    for sb in open_bounds(rng, 50, 80):
        step = _step_arrays(sb)
        for T in (sb.refined() * f for f in (0.5, 1.0, 1.01, 3.0, 1e3)):
            tau0, cap0 = _mode_arrays_ref(T, sb.ca.C, sb.ca.P)
            th0 = _thetas_ref(T, sb, cap0)
            twos += bool((th0 == 2).any())
            rand = th0.copy()
            rand[:, :-1] = rng.integers(0, 2, size=rand[:, :-1].shape)
            merged += bool(((sb.ca.P > 1) & (cap0[:, -1] != VB * (tau0[:, -1] - sb.ca.C))).any())  # the sup, not v = VB
            for loops in MODES:
                tau, cap = mode_arrays(T, sb.ca.C, sb.ca.P, loops)
                np.testing.assert_array_equal(tau, tau0)
                np.testing.assert_array_equal(cap, cap0)
                np.testing.assert_array_equal(_thetas(T, step, cap, loops), th0)
                for th in (th0, rand):
                    got = _costs(T, step, th, tau, cap, loops)
                    np.testing.assert_array_equal(got, _costs_ref(T, sb, th, tau0, cap0))
    assert twos > 0 and merged > 0


def test_two_classes_price_search_is_exact_in_both_modes():
    """Two classes (decision 122): the price search's pair line search spans the whole simplex, so it finds a
    certificate whenever the exact two-class maximum (at a breakpoint or an end) exceeds the threshold by more than
    its bisection's resolution, and never one where it does not (a found row is a valid certificate)."""
    rng = np.random.default_rng(12)
    verdicts = set()
    for _ in range(300):
        B = int(rng.integers(1, 120))
        U = rng.uniform(0.0, 1.0, size=(B, 2))
        U[rng.random((B, 2)) < 0.2] = np.inf
        U[rng.random((B, 2)) < 0.05] = 0.0
        U[rng.random(B) < 0.05] = 0.0  # both zero
        U = np.round(U, int(rng.integers(1, 4)))  # ties between breakpoints
        U[~np.isfinite(U).any(axis=1), 0] = 1.0  # every document fits somewhere (infeasible checks that first)
        wt = rng.integers(1, 4, size=B).astype(np.float64)
        lhs = float(np.where(np.isfinite(U), 0.5 * U, np.inf).min(axis=1) @ wt)
        cnt = rng.uniform(0.5, 1.5, size=2) * max(lhs, 1e-3) * rng.uniform(0.8, 1.3)
        ratio = _two_class_ratio(U, wt, cnt)
        for loops in MODES:
            got = violated(U, wt, cnt, np.array([[0.5, 0.5]]), 6, loops=loops)
            if ratio <= 1 + 1e-9:
                assert not got
            elif ratio > (1 + 1e-9) * (1 + 1e-6):
                assert got
        verdicts.add(ratio > 1 + 1e-9)
    assert verdicts == {True, False}


def test_infeasible_in_one_call_equals_its_kernels_one_by_one_in_both_modes():
    """kernels_modes.mode_infeasible (modes.infeasible's one call): the same costs, the same verdict and the
    same certifying row as mode_arrays, mode_thetas, mode_costs, the fits-nowhere check and the price search called
    one by one; modes.infeasible gives that verdict (one class: the costs' sum against its pipeline count)."""
    rng = np.random.default_rng(13)
    verdicts = set()
    for sb in open_bounds(rng, 40, 80):
        step, K = _step_arrays(sb), sb.ca.cnt.size
        for T in (sb.refined() * f for f in (0.5, 1.0, 1.02, 1.2, 3.0)):
            tau, cap = mode_arrays(T, sb.ca.C, sb.ca.P)
            U = _costs(T, step, _thetas(T, step, cap, km.loops()), tau, cap, km.loops())
            found0 = np.zeros(K)
            if not np.all(np.isfinite(U.min(axis=1))):
                want = True
            elif K == 1:
                want = float(U[:, 0] @ sb.wt) > sb.ca.cnt[0] * (1 + 1e-9)
            else:
                want = violated(U, sb.wt, sb.ca.cnt, sb.Y0, 6, found=found0)
            for loops in MODES:
                got, found = np.empty_like(U), np.zeros(K)
                v = loops.mode_infeasible(float(T), *step[5:], *step[3:5], *step[:3], sb.wt, sb.ca.cnt, sb.Y0, 6,
                                          SWEEPS, found, np.empty((K, VB)), np.empty((K, VB)), np.empty((K, VB)), got)
                np.testing.assert_array_equal(got, U)
                assert (v == 2 if K == 1 and np.all(np.isfinite(U.min(axis=1))) else bool(v) == want)
                np.testing.assert_array_equal(found, found0)
            assert infeasible(T, sb, sb.Y0) == want
            verdicts.add(want)
    assert verdicts == {True, False}
