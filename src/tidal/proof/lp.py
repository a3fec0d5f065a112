"""LP-priced mode certificates (issue 9, decision 61): the mode bound of proof.modes, with prices from an LP.

`proof.modes` proves that no plan has step time <= T by a certificate: prices y_k >= 0 on pipeline classes and, per
class k and mode v (the pipeline runs exactly v micro-batches, each within `tau_v = T / (PP - 1 + v)`, or
`T - (v - 1) c` when PP = 1), a cost per document that the documents of one pipeline in mode v cannot exceed 1 in
total. Its costs mix two resources with a 0/1 weight chosen by a rule of thumb. Here each (k, v) mixes four
resources with weights theta_kv in the simplex, each a row whose sum over one pipeline's documents is at most 1 in
mode v:

- work: `w_ik / C_v` (C_v = v (tau_v - c), as in proof.modes);
- tokens: `l_i / (v M_k)` (every micro-batch holds at most M_k tokens);
- long documents: `[l_i > M_k / 2] / v` (two of them never share a micro-batch);
- heavy documents: `[w_ik > (tau_v - c) / 2] / v` (two of them never share a micro-batch: it would take more than
  tau_v); on a one-stage class (PP = 1, time V c + W) `[w_ik > (T - v c) / 2]`, once per pipeline: all its v
  micro-batches together hold work <= T - v c = tau_v - c, so two such documents never share the pipeline at all
  (decision 150; helper 3's finding in decision 147).

A convex combination of rows that each sum to at most 1 sums to at most 1, so with u_ikv = theta_kv . rows and
u_ik = min over the modes v where i is eligible (c + w_ik <= tau_v, l_i <= M_k) of u_ikv, every plan of time <= T
has sum_i min_k y_k u_ik <= sum_k y_k cnt_k (proof.modes' argument, unchanged). A violation proves T is infeasible.

The weights and prices come from the LP whose dual this certificate is: variables x_ikv (documents of length i on
class k in mode v), lambda_kv (pipelines of class k in mode v), and s; minimise s subject to
sum_kv x_ikv = count_i, sum_i x_ikv row_r(i, k, v) <= lambda_kv for the four rows, sum_v lambda_kv <= cnt_k (1 + s).
s > 0 means T is infeasible for this relaxation, and the LP's duals (mu_r,kv on the rows, y_k on the counts) give
theta_kv = mu_kv / sum_r mu_r,kv and y. HiGHS (scipy.optimize.linprog) solves it on lengths rounded down to at most
`NB` geometric buckets (a relaxation: every cost and eligibility is monotone in l, so prices that certify the rounded
documents certify the real ones). **The certificate is then checked in numpy on the exact lengths**, so the bound
never rests on the LP solver's tolerances: a wrong or inaccurate dual only makes the check fail.

Between LP solves the same weights and prices are tried at other T by bisection (cheap numpy checks); each LP is
solved at the midpoint of what is proven and what is not. Cost: about 10 ms per LP on 2 cores, so `select_step` does
not run it; `prove_step_bound` does, after planning (the plan does not depend on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from tidal.core.errors import TidalError
from tidal.planner.bounds import SLACK, StrategyBound, check_lengths, prepare_lengths
from tidal.proof.forced import KIND_DFF, forced_bound
from tidal.proof.milp import milp_bound
from tidal.proof.modes import MIN_GAIN, VB, mode_arrays, mode_bound
from tidal.proof.pool import pool_bound

if TYPE_CHECKING:
    from tidal.planner.select import StepSelection, StrategyProfile

NB = 128  # length buckets of the LP (VB = 24 explicit modes instead of 12: no cell gained, twice the cost)
LP_SOLVES = 3  # LPs per candidate
RETRY = 0.02  # lp_bound's second LP, at lo / (1 + RETRY), when the first one proves nothing (decision 102)
GAP = 2e-3  # prove_selection raises a candidate's bound only when this far under the step's bound and the plan
CHECKS = 20  # numpy bisection steps per LP's prices (0.1 ms each; 10 left 1.0100015 on llama2-7b a800x16 hand github)


def _rounded(l_: np.ndarray, wt: np.ndarray, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths rounded down to at most `nb` geometric bucket edges (each edge a real length), with merged counts."""
    if l_.size <= nb:
        return l_, wt
    edges = np.floor(np.geomspace(l_[0], l_[-1] + 1.0, nb))  # l_: distinct lengths, ascending
    edges = np.unique(l_[np.searchsorted(l_, edges, side="right") - 1])  # snapped down to real lengths (l_[0] first)
    lb = edges[np.searchsorted(edges, l_, side="right") - 1]
    u, inv = np.unique(lb, return_inverse=True)
    return u, np.bincount(inv, weights=wt, minlength=u.size)


def _rows(T: float, sb: StrategyBound, l_: np.ndarray, w: np.ndarray, per_pipe: bool = True):
    """Eligibility (B x K x VB) and the four row coefficients (4 x B x K x VB) at T; merged mode: work only (and, with
    `per_pipe`, a one-stage class's heavy row)."""
    ca = sb.ca
    tau, cap = mode_arrays(T, ca.C, ca.P)  # K x VB
    kap = tau - ca.C[:, None]
    elig = ((l_[:, None, None] <= ca.M[None, :, None])
            & (ca.C[None, :, None] + w[:, :, None] <= tau[None] * (1 + 1e-12)) & (cap[None] >= 0.0))
    v = np.arange(1, VB + 1, dtype=np.float64)[None, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        work = np.where(w[:, :, None] > 0, w[:, :, None] / np.where(cap > 0, cap, 1.0)[None], 0.0)
    tok = l_[:, None, None] / (v * ca.M[None, :, None])
    long_ = (l_[:, None, None] > ca.M[None, :, None] / 2) / v
    # heavy: per micro-batch (1 / v); on a one-stage class (q = 0, as mode_arrays) per pipeline (decision 150)
    one = ~(ca.P - 1.0 > 0)[None, :, None] & per_pipe
    heavy = (w[:, :, None] > kap[None] / 2) / np.where(one, 1.0, v)
    rows = np.stack(np.broadcast_arrays(work, tok, long_, heavy)).astype(np.float64)
    rows[1:, :, :, -1] = 0.0  # v >= VB merged: its token and count rows have no fixed v
    # ... except a one-stage class's heavy row: in every mode v >= VB its work is <= T - VB c = kap, so it holds
    rows[3, :, :, -1] = np.where(one[:, :, 0], heavy[:, :, -1], 0.0)
    return elig, rows


def certified(T: float, sb: StrategyBound, theta: np.ndarray, y: np.ndarray, per_pipe: bool = True) -> bool:
    """True when (theta: K x VB x 4, y: K) prove that no plan has step time <= T, checked on the exact lengths."""
    elig, rows = _rows(T, sb, sb.l_, sb.w, per_pipe)
    u = np.where(elig, np.einsum("kvr,rbkv->bkv", theta, rows), np.inf).min(axis=2)  # B x K
    if not np.all(np.isfinite(u).any(axis=1)):
        return True  # some document fits nowhere at T
    with np.errstate(invalid="ignore"):
        yu = np.where(np.isfinite(u), u * y[None, :], np.inf).min(axis=1)
    return bool(yu @ sb.wt > float(y @ sb.ca.cnt) * (1 + 1e-9))


def _fits_nowhere(T: float, sb: StrategyBound) -> bool:
    elig, _ = _rows(T, sb, sb.l_, sb.w)
    return not bool(np.all(elig.any(axis=(1, 2))))


def lp_prices(T: float, sb: StrategyBound, nb: int = NB,
              per_pipe: bool = True) -> tuple[float, np.ndarray, np.ndarray] | None:
    """Solve the LP of the module doc at T on rounded lengths: (s, theta K x VB x 4, y K), or None if HiGHS fails."""
    ca = sb.ca
    K = ca.cnt.size
    l_, wt = _rounded(sb.l_, sb.wt, nb)
    w = ca.A[None, :] * (l_ * l_)[:, None] + ca.B[None, :] * l_[:, None] + ca.D[None, :]
    elig, rows = _rows(T, sb, l_, w, per_pipe)
    ib, ik, iv = np.nonzero(elig)
    nx, nl = ib.size, K * VB
    n = nx + nl + 1
    # rows r * nl + k * VB + v: sum_x coef x - lambda_kv <= 0; then K count rows
    coef = rows[:, ib, ik, iv]  # 4 x nx
    r_id = np.arange(4)[:, None] * nl + (ik * VB + iv)[None, :]
    keep = coef != 0.0
    lam_rows = np.arange(4 * nl)
    ub_r = np.concatenate([r_id[keep], lam_rows, 4 * nl + np.repeat(np.arange(K), VB), 4 * nl + np.arange(K)])
    ub_c = np.concatenate([np.broadcast_to(np.arange(nx), (4, nx))[keep], nx + lam_rows % nl, nx + np.arange(nl),
                           np.full(K, n - 1)])
    ub_v = np.concatenate([coef[keep], -np.ones(4 * nl), np.ones(nl), -ca.cnt])
    A_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(4 * nl + K, n)).tocsr()
    b_ub = np.concatenate([np.zeros(4 * nl), ca.cnt])
    A_eq = coo_matrix((np.ones(nx), (ib, np.arange(nx))), shape=(l_.size, n)).tocsr()
    c = np.zeros(n)
    c[-1] = 1.0
    bounds = np.zeros((n, 2))
    bounds[:, 1] = np.inf
    bounds[-1] = (-1.0, np.inf)
    if not np.all(elig.any(axis=(1, 2))):
        return None  # a document fits nowhere: certified() sees it without prices
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=wt, bounds=bounds, method="highs")
    if res.status != 0:
        return None
    mu = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    y = mu[4 * nl:]
    th = mu[:4 * nl].reshape(4, K, VB).transpose(1, 2, 0)
    tot = th.sum(axis=2, keepdims=True)
    th = np.where(tot > 0, th / np.where(tot > 0, tot, 1.0), np.array([1.0, 0.0, 0.0, 0.0]))
    return float(res.fun), th, y


def lp_bound(sb: StrategyBound, lo: float, hi: float, solves: int = LP_SOLVES, nb: int = NB,
             per_pipe: bool = True) -> float:
    """The largest T in (lo, hi] proven by LP-priced certificates (times 1 - SLACK), or lo. At most `solves` LPs:
    the first at lo (1 + MIN_GAIN) (when its prices prove nothing, those of one more LP at lo / (1 + RETRY) are
    tried there, and the search ends when they fail too); each later one at the midpoint of the proven and the
    unproven; after each, its prices are tried further up by bisection. `per_pipe`: the one-stage heavy row counted
    once per pipeline (decision 150), else once per micro-batch as for other classes."""
    if sb.final is not None or not hi > lo:
        return lo
    a, b = lo, hi  # a: proven (or lo); b: not proven
    T = min(hi, lo * (1 + MIN_GAIN))
    for it in range(solves):
        out = lp_prices(T, sb, nb, per_pipe)
        proven = _fits_nowhere(T, sb) if out is None else (out[0] > 0 and certified(T, sb, out[1], out[2], per_pipe))
        if not proven and it == 0:
            # the LP's lengths are rounded down, so it can be feasible just above a good lo while the prices of an
            # LP further down still certify the exact lengths above lo (decision 102): one more LP at lo / 1.02
            low = lp_prices(lo / (1 + RETRY), sb, nb, per_pipe)
            if low is not None and low[0] > 0 and certified(T, sb, low[1], low[2], per_pipe):
                out, proven = low, True
        if not proven:
            if a == lo:
                break  # nothing to gain even just above lo
            b = T
        else:
            a = T
            if out is not None:  # the same prices, further up
                hi_c = b
                for _ in range(CHECKS):
                    m = 0.5 * (a + hi_c)
                    if certified(m, sb, out[1], out[2], per_pipe):
                        a = m
                    else:
                        hi_c = m
        if b <= a * (1 + MIN_GAIN):
            break
        T = 0.5 * (a + b)
    return max(lo, a * (1 - SLACK)) if a > lo else lo


def prove_selection(lengths, profiles: Sequence[StrategyProfile], sel: StepSelection,
                    solves: int = LP_SOLVES, milp_s: float = 0.0,
                    pool_s: float = 0.0, pool_counts: bool = False, pool_iters: int = 4,
                    forced_s: float = 0.0, forced_kinds: float = 0.0) -> StepSelection:
    """`sel` (select_step(lengths, profiles)) with every candidate's bound raised by `modes.mode_bound` and then
    `lp_bound` where it is more than a factor 1 + GAP under min(step bound so far, the plan's estimate), in order of
    bound; the step's bound (plan.lower_bound) is the least of them. The plan itself is unchanged. Deterministic when
    `milp_s` is 0.
    `milp_s` > 0: where a candidate's bound is still that far under, also `milp.milp_bound` (HiGHS MILP over whole-
    document dispatches, `milp_s` seconds per solve; steps of a few documents per pipeline only; decision 108): its
    result rests on HiGHS' tolerances and, where a solve times out, on the machine's speed. `pool_s` > 0: then also
    `pool.pool_bound` (the pooled MILP for steps of hundreds of documents, decision 118), `pool_s` seconds per solve,
    with the same two caveats; `pool_counts`: with its micro-batch count rows, in the compact one-stage encoding
    and, where that leaves the bound still under, in the modes' encoding too (pool.pool_solve's `counts` and
    `compact`; decisions 123 and 126: each encoding proves steps the other does not, and each bound is sound, so the
    higher one is kept). `pool_iters`: pool_bound's bisection halvings (`iters`; decision 127). `forced_s` > 0:
    before the pooled MILP, `forced.forced_bound` (the forced documents whole, the others fluid per kind; decision
    145), `forced_s` seconds per solve, `pool_iters` halvings, with the same two caveats. `forced_kinds` = G > 0 (with
    `forced_s`): then, where the candidate's bound is still under top / (1 + G) (top: min(step bound so far, the
    plan's estimate)), its per-kind form with the dual feasible function rows (forced.KIND_DFF; decision 153), first
    at top / (1 + G), then `pool_iters` halvings under it: G = 0.0099 asks first whether the plan is within 1 % of
    every plan."""
    if isinstance(pool_iters, bool) or not isinstance(pool_iters, (int, np.integer)) or pool_iters < 0:
        raise TidalError(f"prove_selection: pool_iters must be an integer >= 0, got {pool_iters!r}")
    for name, v in (("milp_s", milp_s), ("pool_s", pool_s), ("forced_s", forced_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not v >= 0:
            raise TidalError(f"prove_selection: {name} must be seconds >= 0 (0: off), got {v!r}")
    if isinstance(forced_kinds, bool) or not isinstance(forced_kinds, (int, float, np.integer, np.floating)) \
            or not 0 <= forced_kinds < 1:
        raise TidalError(f"prove_selection: forced_kinds must be a gap in [0, 1) (0: off), got {forced_kinds!r}")
    l_ = check_lengths(lengths)
    if len(sel.strategies) != len(profiles):
        raise TidalError(f"prove_selection: the selection reports {len(sel.strategies)} candidates, "
                         f"{len(profiles)} profiles were given")
    if l_.size == 0:
        return sel
    est, prep = sel.plan.est_step_time, prepare_lengths(l_)
    reports = list(sel.strategies)
    lb = float("inf")
    for i in sorted(range(len(reports)), key=lambda i: (reports[i].lower_bound, i)):
        b = reports[i].lower_bound
        if b >= lb:
            break
        if b * (1 + GAP) < min(lb, est) and int(l_.max()) <= profiles[i].max_len:
            p = profiles[i]
            sb = StrategyBound(l_, p.pipes, arrays=p.class_arrays, prep=prep)
            top = min(lb, est)
            b = max(b, mode_bound(sb, b, top))  # select_step's reported bound before decision 154
            lpb = lp_bound(sb, b, top, solves)
            if not np.all(sb.ca.P - 1.0 > 0):  # a one-stage class: the per-micro-batch rows' search too (decision 150)
                lpb = max(lpb, lp_bound(sb, b, top, solves, per_pipe=False))
            b = max(b, lpb)
            if milp_s > 0 and b * (1 + GAP) < top:
                b = max(b, milp_bound(l_, p.pipes, b, top, milp_s))
            if forced_s > 0 and b * (1 + GAP) < top:
                b = max(b, forced_bound(l_, p.pipes, b, top, forced_s, int(pool_iters)))
            if forced_s > 0 and forced_kinds > 0 and b * (1 + forced_kinds) < top:
                b = max(b, forced_bound(l_, p.pipes, b, top, forced_s, int(pool_iters), gap=forced_kinds,
                                        dff=KIND_DFF, slot_rows=False))
            if pool_s > 0 and b * (1 + GAP) < top:
                b = max(b, pool_bound(l_, p.pipes, b, top, pool_s, int(pool_iters), counts=pool_counts,
                                      compact=pool_counts))
            if pool_s > 0 and pool_counts and b * (1 + GAP) < top:
                b = max(b, pool_bound(l_, p.pipes, b, top, pool_s, int(pool_iters), counts=True, compact=False))
            reports[i] = replace(reports[i], lower_bound=b)
        lb = min(lb, b)
    lb = max(lb, sel.plan.lower_bound)
    return replace(sel, plan=replace(sel.plan, lower_bound=lb), strategies=tuple(reports))
