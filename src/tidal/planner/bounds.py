"""Lower bounds on pipeline and step latency under the cost model (derivations in docs/planner.md).

Cost model: a micro-batch holding documents l_1..l_k on a pipeline with coefficients (a, b, c, d) runs one stage in
c + sum(a l^2 + b l + d) (the per-document work w(l) = a l^2 + b l + d); a pipeline of PP stages running V
micro-batches takes (PP - 1 + V) * max micro-batch time. Every micro-batch must hold at most MaxLen tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from tidal.core.errors import TidalError
from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.pipecost import bound_value, stage_q

# Bounds are scaled by (1 - SLACK) so float rounding never lets a bound exceed an estimate computed another way.
SLACK = 1e-9


@dataclass(frozen=True)
class Eq1Coeffs(LatencyCoeffs):
    """The latency coefficients of a pipeline priced by Hydraulis Eq. 1 (`PipeCost.eq1`): what `PipeCost.coeffs`
    returns for such a pipeline, so that the packer and `packing.pipeline_time`, which take (coeffs, PP), price it
    the same way (decision 97)."""


def prices_eq1(coeffs: LatencyCoeffs) -> bool:
    """Whether coefficients carry the Hydraulis Eq. 1 rule (Eq1Coeffs)."""
    return isinstance(coeffs, Eq1Coeffs)


@dataclass(frozen=True)
class PipeCost:
    """What the planner needs to know about one pipeline: slowest-stage coefficients, PP degree and MaxLen, and how a
    one-stage pipeline is priced: `eq1` False (Tidal, decision 94) as the sum of its micro-batches, V c + W; True
    (the Hydraulis baseline, decision 97) by Hydraulis Eq. 1, V x its slowest micro-batch. The rule travels with
    the pipeline (`q`, `coeffs`) into the dispatch, the packer and the estimates; PP >= 2 is priced alike."""

    a: float
    b: float
    c: float
    pp: int
    max_len: int
    d: float = 0.0  # per-document seconds (LatencyCoeffs.d)
    eq1: bool = False

    @staticmethod
    def of(coeffs: LatencyCoeffs, pp: int, max_len: int, eq1: bool | None = None) -> PipeCost:
        """`eq1` None: the rule `coeffs` carries (Eq1Coeffs or not)."""
        e = prices_eq1(coeffs) if eq1 is None else bool(eq1)
        return PipeCost(float(coeffs.a), float(coeffs.b), float(coeffs.c), int(pp), int(max_len), float(coeffs.d), e)

    @property
    def q(self) -> float:
        """q of the cost formula (pipecost.stage_q): PP - 1, or pipecost.EQ1_Q for a one-stage Eq. 1 pipeline."""
        return stage_q(self.pp, self.eq1)

    @property
    def coeffs(self) -> LatencyCoeffs:
        return (Eq1Coeffs if self.eq1 else LatencyCoeffs)(self.a, self.b, self.c, self.d)

    def work(self, lengths: np.ndarray) -> np.ndarray:
        """Per-document work w(l) = a l^2 + b l + d."""
        l_ = np.asarray(lengths, dtype=np.float64)
        return self.a * l_ * l_ + self.b * l_ + self.d

    def w1(self, x: float) -> float:
        """w(x) for one length, as Python floats."""
        return self.a * x * x + self.b * x + self.d


def check_lengths(lengths) -> np.ndarray:
    """Validate sequence lengths: a 1-D sequence of integers >= 1. Returns an int64 array."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise TidalError(f"sequence lengths must be a 1-D list, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not np.all(np.isfinite(arr) & (arr == np.round(arr)))):
        raise TidalError("sequence lengths must be integers")
    out = arr.astype(np.int64)
    if out.min() < 1:
        raise TidalError(f"sequence lengths must be >= 1, got {int(out.min())}")
    return out


def check_pipe(pp: int, max_len: int, coeffs: LatencyCoeffs) -> None:
    if pp < 1 or max_len < 1:
        raise TidalError(f"pipeline needs pp >= 1 and max_len >= 1, got pp={pp} max_len={max_len}")
    co = (coeffs.a, coeffs.b, coeffs.c, coeffs.d)
    if min(co) < 0 or not all(map(math.isfinite, co)):
        raise TidalError(f"latency coefficients must be finite and >= 0, got {coeffs}")


def pipeline_bound(lengths: np.ndarray, p: PipeCost) -> float:
    """Lower bound on the packed latency of a fixed set of documents on one pipeline:
    min over V in [V_min, U] of (PP - 1 + V) * max(W/V + c, c + w(l_max)), V_min = ceil(tokens / MaxLen)."""
    l_ = np.asarray(lengths, dtype=np.int64)
    if l_.size == 0:
        return 0.0
    wk = p.work(l_)
    return bound_value(p.pp - 1, p.c, p.max_len, float(wk.sum()), int(l_.sum()), float(wk.max()), wk.size) * (1 - SLACK)


def work_capacity(t: np.ndarray, c: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """Largest work W (seconds of sum a l^2 + b l) one pipeline can finish within time t, relaxing V to any real >= 1:
    cap(t) = sup_{V >= 1} V * (t / (PP - 1 + V) - c). With q = PP - 1 the optimum is V = sqrt(t q / c) - q, giving
    (sqrt(t) - sqrt(q c))^2 when that V exceeds 1 (t > PP^2 c / q), else V = 1 and t / PP - c. Nondecreasing in t."""
    p, c, thr, sq = _capacity_consts(c, pp)
    t = np.asarray(t, dtype=np.float64)
    root = np.sqrt(t) - sq
    return np.maximum(np.where(t > thr, root * root, t / p - c), 0.0)


def _capacity_consts(c, pp) -> tuple:
    """What work_capacity needs of the pipelines alone (c, PP)."""
    c = np.asarray(c, dtype=np.float64)
    p = np.asarray(pp, dtype=np.float64)
    q = p - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        thr = np.where(q > 0, p * p * c / np.where(q > 0, q, 1.0), np.inf)
    return p, c, thr, np.sqrt(q * c)


def _min_time_consts(c: np.ndarray, pp: np.ndarray) -> tuple:
    """What min_time needs of the classes alone (c, PP): computed once per candidate by ClassArrays."""
    p, c, b2, s = _capacity_consts(c, pp)
    bps = np.unique(np.concatenate([[0.0], p * c, b2[np.isfinite(b2)]]))
    # per segment index seg in [0, nb] (min_time): its ends, a point inside, and the coefficients of A, B and C0
    left = bps[np.maximum(np.arange(bps.size + 1) - 1, 0)]
    right = np.append(bps, np.inf)
    mid = np.where(np.isfinite(right), 0.5 * (left + right), left + 1.0)
    lin = (mid[:, None] > p * c) & (mid[:, None] <= b2)
    rt = mid[:, None] > b2
    seg = (left, right, lin / p + rt, rt * (-2.0 * s), rt * s * s - lin * c)
    return bps, work_capacity(bps[None, :], c[:, None], p[:, None]), seg


def min_time(G: np.ndarray, total: np.ndarray, consts: tuple) -> np.ndarray:
    """Per row r, the T solving sum_k G[r, k] cap_k(T) = total[r] (exactly: the sum is A T + B sqrt(T) + C0 between
    consecutive breakpoints PP c and PP^2 c / (PP - 1) of the caps, so each segment is a quadratic in sqrt(T)), the
    classes' (c, PP) given by `consts` = _min_time_consts(c, pp)."""
    bps, capb, (left_s, right_s, cA, cB, cC) = consts
    Fb = G @ capb  # R x nb
    seg = (Fb < total[:, None]).sum(axis=1)  # crossing lies in (bps[seg-1], bps[seg]] (or beyond the last)
    left, right = left_s[seg], right_s[seg]
    # on the segment, sum_k G cap_k(T) = A T + B sqrt(T) + C0 (lin: linear caps, rt: square-root caps)
    A = (G * cA[seg]).sum(axis=1)
    B = (G * cB[seg]).sum(axis=1)
    C0 = (G * cC[seg]).sum(axis=1)
    disc = np.maximum(B * B - 4.0 * A * (C0 - total), 0.0)
    u = np.full(A.shape, np.inf)
    np.divide(-B + np.sqrt(disc), 2.0 * A, out=u, where=A > 0)
    T = np.minimum(np.maximum(u * u, left), right)  # np.clip's values, without its Python wrapper
    return np.where(total > 0, T, 0.0)


def group_pipes(pipes: Sequence[PipeCost]) -> tuple[tuple[PipeCost, ...], np.ndarray]:
    """Identical pipelines grouped in order of first appearance: (classes, count per class)."""
    order: dict[PipeCost, int] = {}
    for p in pipes:
        order[p] = order.get(p, 0) + 1
    return tuple(order), np.array(list(order.values()), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class ClassArrays:
    """A strategy's pipeline classes (group_pipes order) as the arrays the bounds use, with min_time's constants:
    built once per candidate (StrategyProfile.class_arrays), not once per bound."""

    classes: tuple[PipeCost, ...]
    cnt: np.ndarray  # pipelines per class
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    P: np.ndarray  # PP, float
    M: np.ndarray  # MaxLen, float
    mt: tuple  # _min_time_consts(C, P)
    D: np.ndarray  # per-document term d

    @staticmethod
    def of(grouped: tuple[tuple[PipeCost, ...], np.ndarray]) -> ClassArrays:
        classes, cnt = grouped
        C = np.array([p.c for p in classes])
        P = np.array([p.pp for p in classes], dtype=np.float64)
        return ClassArrays(classes, cnt, np.array([p.a for p in classes]), np.array([p.b for p in classes]), C, P,
                           np.array([p.max_len for p in classes], dtype=np.float64), _min_time_consts(C, P),
                           np.array([p.d for p in classes]))


@dataclass(frozen=True, eq=False)
class StepLengths:
    """One step's lengths as strategy_bound uses them (distinct lengths and their counts, quantiles): computed once
    per step (prepare_lengths) and shared by the bounds of every candidate."""

    full: np.ndarray  # float64, as given
    uniq: np.ndarray  # distinct lengths, ascending
    wt: np.ndarray  # count of each
    refs: np.ndarray  # distinct quantiles 0, 0.5, 0.9, 1 of full
    ref90: float  # quantile 0.9 of full
    desc: np.ndarray  # int64, descending: the longest first (top_docs_bound's documents)


def prepare_lengths(lengths) -> StepLengths:
    full = np.asarray(lengths, dtype=np.float64)
    uniq, counts = np.unique(full, return_counts=True)  # the counts as floats: bincount of ones, the same values
    desc = np.sort(full.astype(np.int64))[::-1]
    if not full.size:
        return StepLengths(full, uniq, counts.astype(np.float64), full, 0.0, desc)
    q = np.quantile(full, [0.0, 0.5, 0.9, 1.0])  # one call: each quantile the same float as its own call
    return StepLengths(full, uniq, counts.astype(np.float64), np.unique(q), float(q[2]), desc)


def top_docs_bound(lengths: np.ndarray, pipes: Sequence[PipeCost], r: int = 6, node_limit: int = 3000,
                   loops: SimpleNamespace | None = None, arrays: ClassArrays | None = None) -> float:
    """min over dispatches of only the r longest documents of max_j f_j, f_j the pipeline_bound of the documents on j,
    by exhaustive branch and bound (identical pipelines merged; kernels_pack.top_search, the one source). f only
    grows when a document is added (W, w_max and V_min grow; the new top V = U + 1 costs >= (PP + U)(c + w_max) >=
    f(U)), so this bounds the full step. Falls back to fewer documents when the search exceeds `node_limit` nodes;
    0.0 if even one document is too many. `loops`: kernels_pack.loops() (compiled where numba is installed) unless
    given (kernels_pack.PLAIN: plain Python). `arrays`: the ClassArrays of `pipes`, when the caller has them."""
    if loops is None:
        from tidal.planner import kernels_pack

        loops = kernels_pack.loops()
    l_ = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    ca = ClassArrays.of(group_pipes(pipes)) if arrays is None else arrays
    top = np.ascontiguousarray(l_[:r])
    while r >= 1:
        v = loops.top_search(top[:r], ca.A, ca.B, ca.D, ca.C, ca.P.astype(np.int64) - 1, ca.M.astype(np.int64),
                             ca.cnt, node_limit)
        if v >= 0:
            return v
        r //= 2
    return 0.0


def _timed(Y, w, wt, tau, cnt, lo: float, mt: tuple) -> float:
    """Work bound with time-dependent eligibility (docs/planner.md, "Time-dependent eligibility"): a document may only
    use pipelines where it alone fits (PP (c + w) <= T). lhs_r(T) = sum_i min_{j ok at T} y_rj w_ij is constant between
    consecutive eligibility times tau, so on each such segment [a, b) the infeasible T are those below min(b, T_s),
    T_s solving rhs_r(T) = sum_j y_rj cap_j(T) = lhs exactly (min_time); the bound is the largest of these."""
    R = Y.shape[0]
    B = tau.shape[0]
    G = cnt[None, :] * Y
    order = np.argsort(tau, axis=1, kind="stable")  # per document, classes by the time they become eligible
    r_, b_ = np.arange(R)[:, None, None], np.arange(B)[:, None]  # gathers: np.take_along_axis's arrays, unwrapped
    ts = tau[b_, order]
    wy = np.where(np.isfinite(tau)[None, :, :], w[None, :, :] * Y[:, None, :], np.inf)  # R x B x K
    run = np.minimum.accumulate(wy[r_, b_, order], axis=2)
    # lhs at lo: every document already fits somewhere (lo >= LB_doc), at the last position with ts <= lo
    pos = np.maximum((ts <= lo).sum(axis=1) - 1, 0)
    L0 = run[r_[:, :, 0], b_[:, 0], pos] @ wt
    # each later eligibility time lowers the document's running minimum
    prev = np.concatenate([np.full((R, B, 1), np.inf), run[:, :, :-1]], axis=2)
    ev = (ts > lo) & np.isfinite(ts)
    dec = np.where(ev[None] & np.isfinite(prev), prev - run, 0.0) * wt[None, :, None]
    t_ev = ts[ev]
    srt = np.argsort(t_ev, kind="stable")
    t_ev, d_ev = t_ev[srt], dec[:, ev][:, srt]
    starts, first = np.unique(t_ev, return_index=True)
    if t_ev.size:
        last = np.concatenate([first[1:], [t_ev.size]]).astype(np.int64) - 1
        L = np.concatenate([L0[:, None], L0[:, None] - np.cumsum(d_ev, axis=1)[:, last]], axis=1)
    else:
        L = L0[:, None]
    a = np.concatenate([[lo], starts])  # segment s is [a[s], b[s]) with lhs L[:, s]
    b = np.concatenate([starts, [np.inf]])
    Ts = min_time(np.repeat(G, a.size, axis=0), np.maximum(L, 0.0).ravel(), mt).reshape(R, a.size)
    cand = np.where(Ts > a[None, :], np.minimum(Ts, b[None, :]), -np.inf)
    return max(lo, float(cand.max()))


def strategy_bound(lengths, pipes: Sequence[PipeCost], weights=None, top: int = 6, timed: bool = True,
                   arrays: ClassArrays | None = None, prep: StepLengths | None = None) -> float:
    """Lower bound on the optimal step time of documents `lengths` on a strategy (any dispatch, any packing):
    max(LB_doc, LB_top, LB_work, LB_one) (docs/planner.md, "Step bound of a strategy"). `weights` (optional)
    multiplies each document; inf when a document fits no pipeline. `arrays`, `prep`:
    ClassArrays.of(group_pipes(pipes)), prepare_lengths(lengths) (without `weights`), when the caller has them."""
    return StrategyBound(lengths, pipes, weights, arrays, prep).refined(top, timed)


class StrategyBound:
    """strategy_bound in two stages that share their work: `quick`, the doc, one-pipeline and work bounds at the
    fixed reference prices (strategy_bound with top=0, timed=False), and `refined(...)`, strategy_bound itself,
    which adds the time-dependent work bound and the top-documents bound."""

    def __init__(self, lengths, pipes: Sequence[PipeCost], weights=None, arrays: ClassArrays | None = None,
                 prep: StepLengths | None = None):
        self.final: float | None = None  # the bound when no stage is needed (no documents, nowhere to run one)
        self.pipes, self.weighted = pipes, weights is not None
        if weights is None:
            prep = prepare_lengths(lengths) if prep is None else prep
            full, l_, wt, refs, self.ref90, self.desc = prep.full, prep.uniq, prep.wt, prep.refs, prep.ref90, prep.desc
        else:
            full = np.asarray(lengths, dtype=np.float64)
            l_, inv = np.unique(full, return_inverse=True)
            wt = np.bincount(inv.ravel(), weights=np.asarray(weights, dtype=np.float64), minlength=l_.size)
            # Price reference lengths: quantiles of the distinct lengths when weighted.
            refs = np.unique(np.quantile(l_, [0.0, 0.5, 0.9, 1.0])) if l_.size else l_
            self.ref90 = float(np.quantile(l_, 0.9)) if l_.size else 0.0
        if full.size == 0 or not pipes:
            self.final = self.quick = 0.0 if full.size == 0 else float("inf")
            return
        ca = ClassArrays.of(group_pipes(pipes)) if arrays is None else arrays
        A, B, C, P, M, Dd = ca.A, ca.B, ca.C, ca.P, ca.M, ca.D
        if l_[-1] > M.max():  # the longest distinct length (ascending) fits no class
            self.final = self.quick = float("inf")
            return
        elig = l_[:, None] <= M[None, :]
        w = A[None, :] * (l_ * l_)[:, None] + B[None, :] * l_[:, None] + Dd[None, :]
        self.ca, self.full, self.l_, self.wt, self.w = ca, full, l_, wt, w
        self.wm = np.where(elig, w, np.inf)
        self._wmT = wmT = np.ascontiguousarray(self.wm.T)  # K x U: one row per class (_bound_for, refined)
        # per document, min over the classes of P (c + w) where it fits: K - 1 elementwise minima of rows (the same
        # floats as a min over the K-wide axis, faster for small K)
        per_doc = P[0] * (C[0] + wmT[0])
        for k in range(1, wmT.shape[0]):
            np.minimum(per_doc, P[k] * (C[k] + wmT[k]), out=per_doc)
        if weights is None:  # every count is >= 1
            self.lb_doc = float(per_doc.max())
        else:
            self.lb_doc = float(per_doc[wt > 0].max()) if np.any(wt > 0) else 0.0
        # Price candidates: inverse work of each class at a few reference lengths, plus uniform.
        r = refs[:, None]  # one row per reference length, the same floats as one expression per length
        Y = np.vstack([1.0 / np.maximum(A[None, :] * r * r + B[None, :] * r + Dd[None, :], 1e-300),
                       np.ones((1, len(ca.classes)))])
        Y = Y / Y.sum(axis=1, keepdims=True)
        vals = self._bound_for(Y)
        best_i = int(np.argmax(vals))
        self.Y0, self.y0, self.best0 = Y, Y[best_i], float(vals[best_i])  # Y0: the mode bound starts from it
        # One pipeline in all: every document is on it, so its own bound (with V >= tokens / MaxLen, which the work
        # and mode terms relax: they may mix modes fractionally) bounds the step.
        self.lb_one = pipeline_bound(full, ca.classes[0]) if ca.cnt.sum() == 1 and weights is None else 0.0
        self.quick = max(self.lb_doc, self.best0, self.lb_one, 0.0) * (1 - SLACK)

    def _bound_for(self, Y: np.ndarray) -> np.ndarray:  # Y: R x K prices -> R bounds
        # the least priced work per document, min over the K classes as K - 1 elementwise minima of rows (the same
        # floats as np.min over a K-wide last axis, NaN included, several times faster for small K: decision 117)
        wmT = self._wmT
        total = wmT[0][None, :] * Y[:, 0:1]
        for k in range(1, wmT.shape[0]):
            np.minimum(total, wmT[k][None, :] * Y[:, k:k + 1], out=total)
        total = total @ self.wt  # R
        return min_time(self.ca.cnt[None, :] * Y, total, self.ca.mt)

    def refined(self, top: int = 6, timed: bool = True) -> float:
        if self.final is not None:
            return self.final
        ca, l_, wt, lb_doc, best = self.ca, self.l_, self.wt, self.lb_doc, self.best0
        classes, cnt, A, B, C, P = ca.classes, ca.cnt, ca.A, ca.B, ca.C, ca.P
        if timed and len(classes) > 1:
            # Also price only the faster classes (zero price on the m slowest): the documents that cannot run on the
            # slow classes within T must fit in the fast ones.
            ref = self.ref90
            slow = np.argsort(-(P * (C + A * ref * ref + B * ref + ca.D)), kind="stable")
            Ys = [self.y0]
            for m in range(1, len(classes)):
                z = self.y0.copy()
                z[slow[:m]] = 0.0
                Ys.append(z)
            best = max(best, _timed(np.array(Ys), self.w, wt, P[None, :] * (C[None, :] + self.wm), cnt,
                                    max(best, lb_doc), ca.mt))
        # the `top` longest documents (it sorts its own; the longest r of these are the longest r of all)
        lb_top = top_docs_bound(self.desc[:top] if not self.weighted else l_[wt > 0], self.pipes, r=top,
                                arrays=ca) if top > 0 else 0.0
        return max(lb_doc, best, lb_top, self.lb_one) * (1 - SLACK)
