"""Mode-aware step bound (issue 9, decisions 57, 102): the work relaxation with each pipeline's integer micro-batch
count. Prices y >= 0 with sum_i min_k y_k u_ik(T) > sum_k y_k cnt_k prove a step time T infeasible; docs/planner.md,
"Mode-aware bound", derives u_ik and states which certificates are tried. After planning only: `lp.prove_selection`
starts its LP search from it (decision 154 took it out of select_step, where it had raised the passes' target and
the reported bound).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tidal.planner.bounds import SLACK, StrategyBound

VB = 12  # modes 1 .. VB - 1 explicit, v >= VB merged
MIN_GAIN = 1e-3  # mode_bound gives up at once when it cannot raise the bound by this factor
NEAR = 1e-3  # mode_bound's third probe, hi / (1 + NEAR) (decision 102: a plan within 0.1 % of its bound)
MODE_ITERS, MODE_ITERS_MANY = 7, 4  # mode_bound's bisection steps (with 3+ classes: a price search per point)
SWEEPS = 2  # pair line-search sweeps of the price search with 3+ classes (decision 102)


def _loops() -> SimpleNamespace:
    from tidal.proof import kernels_modes  # lazily: importing numba takes a second

    return kernels_modes.loops()


def mode_arrays(T: float, C: np.ndarray, P: np.ndarray,
                loops: SimpleNamespace | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per class (rows) and mode (columns 0 .. VB - 1, the last one merged): tau_v and the work capacity C_v
    (kernels_modes.mode_arrays, the one source). One stage (q = 0) runs its micro-batches one after another
    (decision 94): their times sum to <= T, so one of them takes at most T - (v - 1) c and their work is at most
    T - v c. Merged mode v >= VB: sup over real v >= VB of v (T / (q + v) - c)."""
    C = np.ascontiguousarray(C, np.float64)
    tau, cap = np.empty((C.size, VB)), np.empty((C.size, VB))
    (_loops() if loops is None else loops).mode_arrays(float(T), C, np.ascontiguousarray(P, np.float64), tau, cap)
    return tau, cap


def _step_arrays(sb: StrategyBound) -> tuple:
    """What `infeasible` needs that does not depend on T: per class (columns)
    c + w where w is finite (inf where the document does not fit the class), w, l, M, the work per token of a
    pipeline filled with the step's mean document, and C and P (all float64, contiguous: the kernels' arguments).
    mode_bound computes them once per search."""
    ca = sb.ca
    f = np.float64
    fits = np.isfinite(sb.wm)
    cw = np.where(fits, ca.C[None, :] + sb.w, np.inf)
    rho = (sb.w * sb.wt[:, None]).sum(axis=0) / max(float((sb.l_ * sb.wt).sum()), 1e-300)  # work per token, per class
    return (np.ascontiguousarray(cw, f), np.ascontiguousarray(sb.w, f), np.ascontiguousarray(sb.l_, f),
            np.ascontiguousarray(ca.M, f), np.ascontiguousarray(rho, f), np.ascontiguousarray(ca.C, f),
            np.ascontiguousarray(ca.P, f))


def violated(U: np.ndarray, wt: np.ndarray, cnt: np.ndarray, Y: np.ndarray, rounds: int,
             loops: SimpleNamespace | None = None, sweeps: int = SWEEPS, found: np.ndarray | None = None) -> bool:
    """Some price row (from Y, R x K, or multiplicative updates of the best of them: raise the prices of the classes
    whose argmin-assigned cost exceeds their pipeline count; then `sweeps` sweeps of exact line searches along each
    pair of classes, decision 102; with two classes that one line is the whole simplex) certifies
    sum_i min_k y_k u_ik > sum_k y_k cnt_k: kernels_modes.mode_violated (the one source; `loops`:
    kernels_modes.loops(), compiled where numba is installed, unless given). `found` (K): gets the certifying row."""
    f = np.float64
    return bool((_loops() if loops is None else loops).mode_violated(
        np.ascontiguousarray(U, f), np.ascontiguousarray(wt, f), np.ascontiguousarray(cnt, f),
        np.ascontiguousarray(Y, f), int(rounds), int(sweeps), np.zeros(cnt.size) if found is None else found))


def infeasible(T: float, sb: StrategyBound, Y: np.ndarray, rounds: int = 6, step: tuple | None = None,
               found: np.ndarray | None = None) -> bool:
    """True when some price vector proves that no plan has step time <= T (see the module doc; any certificate found
    is valid, the search only makes finding one likelier): mode_arrays, the theta row (kernels_modes.mode_thetas),
    the costs u_ik(T) (kernels_modes.mode_costs: inf where document i fits class k in no mode; its eligible modes
    are a prefix, docs/planner.md, "Mode-aware bound", Costs) and the price search (`violated`) in one call,
    kernels_modes.mode_infeasible. One class: the costs of all documents must fit in its pipeline count. `step`:
    _step_arrays(sb), when the caller has it; `found`: see `violated`."""
    cw, w, l_, M, rho, C, P = _step_arrays(sb) if step is None else step
    K, f = C.size, np.float64
    U = np.empty((l_.size, K))
    verdict = _loops().mode_infeasible(
        float(T), C, P, M, rho, cw, w, l_, np.ascontiguousarray(sb.wt, f), np.ascontiguousarray(sb.ca.cnt, f),
        np.ascontiguousarray(Y, f), int(rounds), SWEEPS, np.zeros(K) if found is None else found,
        np.empty((K, VB)), np.empty((K, VB)), np.empty((K, VB)), U)
    if verdict == 2:
        return float(U[:, 0] @ sb.wt) > sb.ca.cnt[0] * (1 + 1e-9)
    return verdict == 1


def mode_bound(sb: StrategyBound, lo: float, hi: float, iters: int = MODE_ITERS, near: float = NEAR) -> float:
    """The largest T in (lo, hi] that `infeasible` proves (times 1 - SLACK), or lo when it cannot prove
    lo * (1 + MIN_GAIN). After lo * (1 + MIN_GAIN) and hi, it tries hi / (1 + near) (decision 102), then bisects
    for `iters` steps (at most MODE_ITERS_MANY with 3+ classes)."""
    if sb.final is not None or not hi > lo:
        return lo
    Y0 = sb.Y0  # LB_work's price rows
    step = _step_arrays(sb)  # the same for every T tried (and every search on sb)
    found = np.zeros(sb.ca.cnt.size)  # 3+ classes: the last certifying prices, tried first at the next T
    warm = [Y0]

    def proves(T: float) -> bool:
        ok = infeasible(T, sb, warm[0], step=step, found=found)
        if ok and sb.ca.cnt.size > 2 and found.sum() > 0:
            warm[0] = np.vstack([found, Y0])
        return ok

    a, b = min(lo * (1 + MIN_GAIN), hi), hi
    if not proves(a):  # most candidates: nothing (or < MIN_GAIN) to gain, one evaluation
        return lo
    if proves(b):
        return max(lo, b * (1 - SLACK))
    m = hi / (1 + near)
    if near > 0 and m > a:
        if proves(m):
            a = m
        else:
            b = m
    for _ in range(iters if sb.ca.cnt.size <= 2 else min(iters, MODE_ITERS_MANY)):  # 3+ classes: a price search
        m = 0.5 * (a + b)
        if proves(m):
            a = m
        else:
            b = m
    return max(lo, a * (1 - SLACK))
