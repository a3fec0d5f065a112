"""The pooled MILP (issue 27, decision 118): milp.dispatch_feasible's question (is there a whole-document dispatch
whose every pipeline's relaxed cost is <= T?), relaxed so that it solves on steps of hundreds of documents and
pipelines. `pool_feasible` at one T, `pool_bound` by bisection. Opt-in, after planning
(`proof.lp.prove_selection(pool_s=...)`); the plan never depends on it.

What stays integral and what becomes fluid:
- **Long documents** (the `extra` + those that fit not every kind in mode 1 at T; always the longest ones): whole,
  binary x_ij on individually modelled pipelines ("slots"), as in milp.py.
- **Slots**: per kind k (identical PipeCost), S_k = min(n_k, long documents that fit k) pipelines, each with its own
  mode binaries z_jv, symmetry-broken (the r-th longest document may use only the first r + 1 slots of a kind).
  A dispatch puts long documents on at most S_k pipelines of kind k; relabelled, those are the slots.
- **Pool**: the other n_k - S_k pipelines of kind k, which hold no long document: integer m_kv (how many of them
  run v micro-batches), summed rows: work <= m_kv C_kv, tokens <= m_kv v M_k, micro-batches v m_kv <= documents.
- **Short documents** as fluid mass, in length buckets b (lmin_b <= l <= lmax_b): per location (a slot, or a
  pool's (kind, mode)) the count n, tokens t and sum of squares Q of the bucket's documents there, with
  lmin n <= t <= lmax n and lmin t <= Q <= lmax t, and the totals of each bucket exact. The work of a location is
  a_k Q + b_k t + d_k n, exact for any real split. A bucket may be placed where its shortest document fits (l <=
  M_k, c + w(lmin) <= tau_kv; on a slot, only in the modes that allow it).
- **Micro-batch counts** (`counts`, decision 123): on a slot, the whole documents and the fluid ones (buckets whose
  shortest document is) longer than M_k / 2 number at most sum_v v z_jv (two never share a micro-batch), those longer
  than M_k / 3 at most twice that; on a pool location (k, v), the fluid ones at most v m_kv (twice). Buckets get an
  edge at M_k / 2 and M_k / 3 so that none straddles them. These hold for every packing of a plan, not for the
  relaxed cost: with them, "infeasible" proves that no packed plan has step time <= T.
- **Compact one-stage kinds** (`compact`, decision 123). A one-stage pipeline (q = 0) in mode v has work <= T - v c,
  and its per-document limit c + w <= T - (v - 1) c follows from that; so instead of a binary per mode, a slot has a
  binary y (holds anything) and an integer v (its micro-batch count): work + c v <= T y, tokens <= M v, v <= its
  documents (and the count rows); a pool keeps its integer mode counts m_kv but one fluid copy for all its modes,
  with the modes' rows summed: work <= sum_v m_kv C_kv, tokens <= sum_v m_kv min(M v, C_kv / b) (work >= b tokens),
  micro-batches sum_v v m_kv <= documents. Each is a sum of the modes' rows, so a relaxation of them; a kind has a
  few fluid copies where the modes have one per mode (up to T / c of them).
Every whole-document dispatch of relaxed cost <= T gives a solution (the split of each bucket by location), so
"infeasible" proves that no plan has step time <= T (up to HiGHS' tolerances: `pool_bound` scales by 1 - 1e-6, as
milp.py; every row is scaled to values of order 1: lengths in units of the longest, times in seconds).

**The min-T model** (`pool_min_bound`, decision 128; opt-in, used by no plan or proof by default). The structure
(modes, long documents, slots, where each bucket may go) is built at T = hi, the most permissive for every T <= hi;
T is a column in [lo, hi] (lo: a proven bound) and the objective. A slot's capacity sum_v z_v cap_v(T) (cap_v, tau_v
linear in T: `_lin`) uses t_v = T z_v, exact for binaries with sum_v z_v <= 1 (t_v <= hi z_v, sum_v t_v <= T); its
whole documents and each bucket's shortest (as the fraction n / count) keep their micro-batch limit c + w <=
sum_v tau_v(T) z_v. A pool's sum_v m_v cap_v(T) uses P_v = T m_v, relaxed (P_v <= hi m_v and sum_v P_v <= n T - lo
(n - sum_v m_v)); a bucket in a pool mode that needs T >= X there has (X - lo) n / count <= T - lo. Every dispatch
of relaxed cost (with `counts`: packed time) T* in [lo, hi] is a solution with T = T*, so HiGHS' dual bound on min
T is a lower bound at any time-out; where the model is infeasible, hi is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from tidal.planner.bounds import PipeCost
from tidal.planner.exact import MilpRows
from tidal.proof.milp import bisect_infeasible, pipe_modes

NB = 16  # geometric length buckets of the short documents (plus an edge at every kind's MaxLen)
COUNTS = ((2, 1), (3, 2))  # (f, k): documents longer than MaxLen / f, at most k per micro-batch (`counts`)


class Columns:
    """A MILP's columns as they are added (pool.py's and forced.py's models): `cols(k, integer, upper)` returns k new
    column indices, each integral (1) or not (0), in [0, upper]; `n`, `integ` and `ub` for the solve."""

    def __init__(self) -> None:
        self.n = 0
        self.integ: list[int] = []
        self.ub: list[float] = []

    def __call__(self, k: int, integer: int, upper: float) -> list[int]:
        out = list(range(self.n, self.n + k))
        self.n += k
        self.integ.extend([integer] * k)
        self.ub.extend([upper] * k)
        return out


def length_buckets(short: np.ndarray, edges_extra: Sequence[int], nb: int) -> list[np.ndarray]:
    """The positions in `short` (lengths, descending) of each bucket: split at nb geometric edges and at
    `edges_extra` (a bucket never straddles one)."""
    if short.size == 0:
        return []
    lo, hi = float(short.min()), float(short.max())
    edges = set(np.floor(np.geomspace(lo, hi + 1.0, nb + 1))[1:-1].tolist()) | {float(e) for e in edges_extra}
    cuts = np.array(sorted(e for e in edges if lo < e <= hi))  # bucket: lengths in [edge, next edge)
    key = np.searchsorted(cuts, short, side="right")
    return [np.flatnonzero(key == k) for k in np.unique(key)]


def pool_feasible(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0,
                  extra: int = 0, nb: int = NB, whole: int | None = None, counts: bool = False,
                  compact: bool = False) -> str:
    """"infeasible" (no whole-document dispatch has every pipeline's relaxed cost <= T: every plan is slower than T,
    up to HiGHS' tolerances), "feasible" (the relaxation has a solution: proves nothing), or "unknown" (time out).
    `extra`: this many more of the longest documents are kept whole beyond those that must be (module doc); `whole`
    (if given): exactly this many of the longest are (a document that must be whole may then be fluid: still valid).
    `counts`: also the micro-batch count rows (module doc, decision 123); "infeasible" then proves that no *packed*
    plan has step time <= T (the rows hold for every packing, not for the relaxed cost). `compact`: one-stage kinds
    by their micro-batch counts instead of modes (module doc, decision 123)."""
    return pool_solve(lengths, pipes, T, time_limit, extra, nb, whole, counts, compact)[0]


def pool_solve(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0,
               extra: int = 0, nb: int = NB, whole: int | None = None,
               counts: bool = False, compact: bool = False,
               tvar: tuple[float, float] | None = None) -> tuple[str, dict | None]:
    """pool_feasible's status and, when "feasible", the relaxation's solution for a diagnosis (benchmarks/gap_pool.py
    rounds it to a dispatch): "order" (document indices, longest first; positions below are into it), "slots" (per
    slot: the pipeline index in `pipes`, its whole documents), "fluid" (per pipeline kind: the pool's pipeline indices
    and, per bucket, the positions of its documents and the counts placed on each slot or on the pool).
    `tvar` (lo, hi): the min-T model instead (module doc): T = hi for the structure, a variable in
    [lo, hi] for the capacities; "infeasible" then says no dispatch meets hi, and the dict also has "dual" (HiGHS'
    dual bound on min T) and "T" (the solution's T, or None: status "unknown", no solution and no other key)."""
    if tvar is not None:
        T = float(tvar[1])
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    l_ = np.asarray(lengths, dtype=np.int64)[order]
    n = l_.size
    if n == 0:
        return "feasible", None
    kinds: dict[PipeCost, int] = {}
    for p in pipes:
        kinds[p] = kinds.get(p, 0) + 1
    ks = list(kinds)
    modes = [pipe_modes(p, T, n) for p in ks]
    one = [compact and p.q == 0 for p in ks]  # one-stage kinds encoded by their micro-batch count (module doc)
    fits1 = np.array([[bool(ms) and x <= p.max_len and p.c + p.w1(float(x)) <= ms[0][2] for p, ms in zip(ks, modes)]
                      for x in l_])  # n x kinds, monotone in length
    if not fits1.any(axis=1).all():
        return "infeasible", None  # some document fits no pipeline at T
    must = int(np.count_nonzero(~fits1.all(axis=1)))
    nbig = min(n, must + max(0, extra)) if whole is None else min(n, whole)
    s = float(l_[0])  # length unit
    rows = MilpRows()
    cols = Columns()

    tv = None if tvar is None else TVar(rows, cols, float(tvar[0]), T)

    big_on: list[list[tuple[int, int]]] = [[] for _ in range(nbig)]  # per long document: (column, slot)
    slots = []  # (kind index, z columns, [(column, doc)])
    for ki, (p, ms) in enumerate(zip(ks, modes)):
        elig = [i for i in range(nbig) if fits1[i, ki]]
        for pos in range(min(kinds[p], len(elig))):
            # compact (one stage): z = [Y (binary: the slot holds anything), V (its micro-batch count)]
            z = cols(1, 1, 1.0) + cols(1, 1, float(len(ms))) if one[ki] else cols(len(ms), 1, 1.0)
            xs = []
            for i in elig:
                if pos <= i:  # symmetry: the i-th longest uses only the first i + 1 slots of a kind
                    (c,) = cols(1, 1, 1.0)
                    xs.append((c, i))
                    big_on[i].append((c, len(slots)))
            slots.append((ki, z, xs))
    for i in range(nbig):
        rows.add([(c, 1.0) for c, _ in big_on[i]], 1.0, 1.0)
    pool_n = [kinds[p] - sum(1 for sl in slots if sl[0] == ki) for ki, p in enumerate(ks)]
    pool = []  # (kind index, mode index, m column); compact: (kind index, -1, the m columns of every mode)
    for ki, ms in enumerate(modes):
        if pool_n[ki] > 0 and ms:
            mcols = cols(len(ms), 1, float(pool_n[ki]))
            if tv is not None:
                tv.pool(mcols, pool_n[ki])
            rows.add([(c, 1.0) for c in mcols], 0.0, float(pool_n[ki]))
            if one[ki]:
                pool.append((ki, -1, mcols))
            else:
                pool.extend((ki, vi, c) for vi, c in enumerate(mcols))
    # per location: [(bucket, n column, t column, Q column)]; bucket b's tokens and squares in units of its longest
    # document u_b (t = tokens / u_b, Q = squares / u_b^2: every linking coefficient in [lmin / lmax, 1])
    loc_fluid: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    cuts = [p.max_len + 1 for p in ks] + ([p.max_len // f + 1 for p in ks for f, _ in COUNTS] if counts else [])
    bks = length_buckets(l_[nbig:], cuts, nb)
    bks = [nbig + pos for pos in bks]  # positions in l_
    units = [float(l_[pos].max()) for pos in bks]
    lmins = [int(l_[pos].min()) for pos in bks]
    for b, pos in enumerate(bks):
        bl = l_[pos]
        lmin, u = float(bl.min()), units[b]
        cnt, tok, sq = float(bl.size), float(bl.sum()) / u, float((bl.astype(np.float64) ** 2).sum()) / (u * u)
        here = []
        for si, (ki, z, _) in enumerate(slots):
            p, ms = ks[ki], modes[ki]
            if one[ki]:
                ok = z[:1] if lmin <= p.max_len and p.c + p.w1(lmin) <= T else []
            else:
                ok = [zc for zc, (v, _, tau) in zip(z, ms) if lmin <= p.max_len and p.c + p.w1(lmin) <= tau]
            if not ok:
                continue
            nc, tc, qc = cols(3, 0, np.inf)
            loc_fluid.setdefault(("s", si), []).append((b, nc, tc, qc))
            rows.add([(nc, 1.0)] + [(zc, -cnt) for zc in ok], -np.inf, 0.0)  # none where no allowed mode is on
            here.append((nc, tc, qc))
        for pi, (ki, vi, _) in enumerate(pool):
            p = ks[ki]
            if lmin <= p.max_len and p.c + p.w1(lmin) <= (T if vi < 0 else modes[ki][vi][2]):
                nc, tc, qc = cols(3, 0, np.inf)
                loc_fluid.setdefault(("p", pi), []).append((b, nc, tc, qc))
                here.append((nc, tc, qc))
                if tv is not None:  # its shortest document's limit, c + w(lmin) <= tau_v(T), for this fraction
                    tv.limit_pool(p, 1 if vi < 0 else modes[ki][vi][0], nc, p.c + p.w1(lmin), cnt)
        if not here:
            return "infeasible", None
        rows.add([(h[0], 1.0) for h in here], cnt, cnt)
        rows.add([(h[1], 1.0) for h in here], tok, tok)
        rows.add([(h[2], 1.0) for h in here], sq, sq)
        for nc, tc, qc in here:  # lmin n <= l-sum <= lmax n, lmin l-sum <= squares <= lmax l-sum, in units of u_b
            rows.add([(tc, 1.0), (nc, -lmin / u)], 0.0, np.inf)
            rows.add([(tc, 1.0), (nc, -1.0)], -np.inf, 0.0)
            rows.add([(qc, 1.0), (tc, -lmin / u)], 0.0, np.inf)
            rows.add([(qc, 1.0), (tc, -1.0)], -np.inf, 0.0)

    def fluid_terms(key, p: PipeCost):
        """A location's fluid: its columns, its work terms (seconds) and its token terms (units of s)."""
        fl = loc_fluid.get(key, [])
        work = ([(qc, p.a * units[b] ** 2) for b, _, _, qc in fl] + [(tc, p.b * units[b]) for b, _, tc, _ in fl]
                + [(nc, p.d) for _, nc, _, _ in fl if p.d])
        return fl, work, [(tc, units[b] / s) for b, _, tc, _ in fl]

    for si, (ki, z, xs) in enumerate(slots):
        p, ms = ks[ki], modes[ki]
        fl, work, toks = fluid_terms(("s", si), p)
        wk = [(c, p.w1(float(l_[i]))) for c, i in xs]
        if one[ki]:
            _compact_rows(rows, p, z[0], z[1], float(len(ms)), [(z[0], -T)] if tv is None else tv.slot_time(z[0]),
                          s, wk + work,
                          [(c, float(l_[i]) / s) for c, i in xs] + toks,
                          [c for c, _ in xs] + [nc for _, nc, _, _ in fl],
                          _bigs(counts, p, [(c, int(l_[i])) for c, i in xs] + [(nc, lmins[b]) for b, nc, _, _ in fl]))
            for c, _ in xs:
                rows.add([(c, 1.0), (z[0], -1.0)], -np.inf, 0.0)
            continue
        rows.add([(zc, 1.0) for zc in z], 0.0, 1.0)
        if tv is None:
            rows.add(wk + work + [(zc, -cap) for zc, (_, cap, _) in zip(z, ms)], -np.inf, 0.0)
        else:  # capacities and the per-document limits of whole documents and of each bucket's shortest, at T
            rows.add(wk + work + tv.slot_caps(p, z), -np.inf, 0.0)
            lim = tv.limits
            for c, w in wk:
                rows.add([(c, p.c + w)] + lim(p, z), -np.inf, 0.0)
            for b, nc, _, _ in fl:
                rows.add([(nc, (p.c + p.w1(lmins[b])) / bks[b].size)] + lim(p, z), -np.inf, 0.0)
        rows.add([(c, float(l_[i]) / s) for c, i in xs] + toks
                 + [(zc, -p.max_len * v / s) for zc, (v, _, _) in zip(z, ms)], -np.inf, 0.0)
        rows.add([(zc, float(v)) for zc, (v, _, _) in zip(z, ms)] + [(c, -1.0) for c, _ in xs]
                 + [(nc, -1.0) for _, nc, _, _ in fl], -np.inf, 0.0)
        for c, w in wk:
            rows.add([(c, 1.0)] + [(zc, -1.0) for zc, (_, _, tau) in zip(z, ms) if p.c + w <= tau], -np.inf, 0.0)
        for big, per in _bigs(counts, p, [(c, int(l_[i])) for c, i in xs] + [(nc, lmins[b]) for b, nc, _, _ in fl]):
            rows.add([(c, 1.0) for c in big] + [(zc, -per * v) for zc, (v, _, _) in zip(z, ms)], -np.inf, 0.0)
    for pi, (ki, vi, mc) in enumerate(pool):
        p = ks[ki]
        fl, work, toks = fluid_terms(("p", pi), p)
        if vi < 0:  # compact pool: one fluid copy, the pipelines' modes summed
            ms = modes[ki]
            rows.add(work + ([(c, -cap) for c, (_, cap, _) in zip(mc, ms)] if tv is None else tv.pool_caps(p, mc)),
                     -np.inf, 0.0)
            # a pipeline in mode v holds at most min(M v, (T - v c) / b) tokens: work >= b tokens (a, d >= 0)
            rows.add(toks + [(c, -min(p.max_len * v, cap / p.b if p.b > 0 else np.inf) / s)
                             for c, (v, cap, _) in zip(mc, ms)], -np.inf, 0.0)
            vs = [(c, float(v)) for c, (v, _, _) in zip(mc, ms)]
            rows.add(vs + [(nc, -1.0) for _, nc, _, _ in fl], -np.inf, 0.0)
            for big, per in _bigs(counts, p, [(nc, lmins[b]) for b, nc, _, _ in fl]):
                rows.add([(c, 1.0) for c in big] + [(c, -per * v) for c, v in vs], -np.inf, 0.0)
            continue
        v, cap, _ = modes[ki][vi]
        rows.add(work + ([(mc, -cap)] if tv is None else tv.pool_caps(p, [mc], v)), -np.inf, 0.0)
        rows.add(toks + [(mc, -p.max_len * v / s)], -np.inf, 0.0)
        rows.add([(mc, float(v))] + [(nc, -1.0) for _, nc, _, _ in fl], -np.inf, 0.0)
        for big, per in _bigs(counts, p, [(nc, lmins[b]) for b, nc, _, _ in fl]):
            rows.add([(c, 1.0) for c in big] + [(mc, -per * v)], -np.inf, 0.0)
    if tv is None:
        x = rows.solve(np.zeros(cols.n), np.array(cols.integ), np.zeros(cols.n), np.array(cols.ub), time_limit,
                       status=True)
        extra_out: dict = {}
    else:
        x, extra_out = tv.solve(cols.n, cols.integ, cols.ub, time_limit)
    if isinstance(x, str):
        return "infeasible", None
    if x is None:
        return "unknown", extra_out or None
    idx = {p: [j for j, q in enumerate(pipes) if q == p] for p in ks}
    used = [0] * len(ks)
    sol_slots = []
    for ki, _, xs in slots:
        sol_slots.append((idx[ks[ki]][used[ki]], [i for c, i in xs if x[c] > 0.5]))
        used[ki] += 1
    where = {("s", si): sol_slots[si][0] for si in range(len(slots))}
    fluid = []
    for b, pos in enumerate(bks):
        placed: dict = {}
        for key, fl in loc_fluid.items():
            for bb, nc, _, _ in fl:
                if bb == b and x[nc] > 1e-9:
                    k2 = where.get(key, ("pool", pool[key[1]][0]) if key[0] == "p" else None)
                    placed[k2] = placed.get(k2, 0.0) + float(x[nc])
        fluid.append((pos, placed))
    pools = {ki: idx[p][used[ki]:] for ki, p in enumerate(ks)}
    return "feasible", {"order": order, "slots": sol_slots, "fluid": fluid, "pools": pools, "kinds": ks, **extra_out}


def _bigs(counts: bool, p: PipeCost, cols_len: list[tuple[int, int]]) -> list[tuple[list[int], float]]:
    """The count rows' (columns, per) of a location of kind p, from (column, length) pairs (whole documents, or fluid
    buckets by their shortest length): per COUNTS entry (f, per), the columns longer than MaxLen / f, which hold at
    most `per` documents per micro-batch."""
    out = []
    for f, per in COUNTS if counts else ():
        big = [c for c, ln in cols_len if ln > p.max_len // f]
        if big:
            out.append((big, float(per)))
    return out


def _compact_rows(rows: MilpRows, p: PipeCost, y: int, v: int, size: float, cap, s: float, work, toks,
                  members: list[int], bigs) -> None:
    """The rows of a one-stage slot in the compact encoding (module doc; y: its binary, v: its micro-batch count,
    `size`: the most micro-batches it may run): work + c v <= T y, v <= size y, tokens <= MaxLen v, v <= its
    documents, and the count rows `bigs`."""
    rows.add(work + [(v, p.c)] + cap, -np.inf, 0.0)
    rows.add([(v, 1.0), (y, -size)], -np.inf, 0.0)
    rows.add(toks + [(v, -p.max_len / s)], -np.inf, 0.0)
    rows.add([(v, 1.0)] + [(c, -1.0) for c in members], -np.inf, 0.0)
    for big, per in bigs:
        rows.add([(c, 1.0) for c in big] + [(v, -per)], -np.inf, 0.0)


def pool_bound(lengths: np.ndarray, pipes: Sequence[PipeCost], lo: float, hi: float, time_limit: float = 10.0,
               iters: int = 4, gap: float = 1e-3, extra: int = 0, nb: int = NB, whole: int | None = None,
               counts: bool = False, compact: bool = False, finish: bool = False) -> float:
    """The largest T in (lo, hi) at which pool_feasible answers "infeasible", times (1 - 1e-6), or lo: first at
    hi / (1 + gap), then `iters` bisection steps between lo and it (milp.bisect_infeasible). `finish`: then one
    min-T solve (pool_min_bound) on the interval the search leaves, [proven, first not proven] (decision 128)."""
    if int(np.asarray(lengths).size) == 0:
        return lo
    out, a, b = bisect_infeasible(
        lambda t: pool_feasible(lengths, pipes, t, time_limit, extra, nb, whole, counts, compact) == "infeasible",
        lo, hi, iters, gap)
    if finish and b < hi:  # searched, and no dispatch meets a (or lo): the min-T model may start there
        out = max(out, pool_min_bound(lengths, pipes, a, b, time_limit, extra, nb, whole, counts, compact))
    return out


def _lin(p: PipeCost, v: int) -> tuple[float, float, float, float]:
    """(alpha, beta, gamma, delta) of mode v of p (pipe_modes): capacity alpha T - beta, micro-batch limit
    gamma T - delta."""
    if p.q > 0:
        return v / (p.q + v), v * p.c, 1.0 / (p.q + v), 0.0
    return 1.0, v * p.c, 1.0, (v - 1) * p.c


class TVar:
    """The min-T model's T column and its products with the mode binaries and pool counts (module doc), on `rows`,
    with columns from `cols` (pool_solve's allocator); T in [lo, hi]."""

    def __init__(self, rows: MilpRows, cols, lo: float, hi: float) -> None:
        self.rows, self.cols, self.lo, self.hi = rows, cols, lo, hi
        (self.T,) = cols(1, 0, hi)
        self.t: dict[int, int] = {}  # mode binary (or count) column -> its product with T

    def _slot(self, z: list[int]) -> list[int]:
        """t_v = T z_v (exact for binaries with sum_v z_v <= 1): t_v <= hi z_v, sum_v t_v <= T."""
        if z[0] not in self.t:
            for zc in z:
                (self.t[zc],) = self.cols(1, 0, self.hi)
                self.rows.add([(self.t[zc], 1.0), (zc, -self.hi)], -np.inf, 0.0)
            self.rows.add([(self.t[zc], 1.0) for zc in z] + [(self.T, -1.0)], -np.inf, 0.0)
        return [self.t[zc] for zc in z]

    def slot_time(self, y: int) -> list[tuple[int, float]]:
        """-T y: a compact slot's time (y: its binary)."""
        return [(self._slot([y])[0], -1.0)]

    def slot_caps(self, p: PipeCost, z: list[int]) -> list[tuple[int, float]]:
        """-(sum_v z_v cap_v(T)): a slot's capacity terms (z: its mode binaries, mode v = position + 1)."""
        ts = self._slot(z)
        return [e for v, (zc, tc) in enumerate(zip(z, ts), 1) for e in ((zc, _lin(p, v)[1]), (tc, -_lin(p, v)[0]))]

    def limits(self, p: PipeCost, z: list[int]) -> list[tuple[int, float]]:
        """-(sum_v z_v tau_v(T)): a slot's micro-batch limit terms."""
        ts = self._slot(z)
        return [e for v, (zc, tc) in enumerate(zip(z, ts), 1) for e in ((zc, _lin(p, v)[3]), (tc, -_lin(p, v)[2]))]

    def pool(self, m: list[int], n: int) -> None:
        """P_v = T m_v for a pool's mode counts (sum_v m_v <= n): P_v <= hi m_v and (McCormick, T >= lo)
        sum_v P_v <= n T - lo (n - sum_v m_v); a relaxation of the products (only upper bounds are needed)."""
        for mc in m:
            (self.t[mc],) = self.cols(1, 0, self.hi * n)
            self.rows.add([(self.t[mc], 1.0), (mc, -self.hi)], -np.inf, 0.0)
        self.rows.add([(self.t[mc], 1.0) for mc in m] + [(mc, -self.lo) for mc in m] + [(self.T, -float(n))],
                      -np.inf, -self.lo * n)

    def pool_caps(self, p: PipeCost, m: list[int], v0: int = 1) -> list[tuple[int, float]]:
        """-(sum m_v cap_v(T)) of a pool's mode counts m (modes v0, v0 + 1, ...)."""
        return [e for v, mc in enumerate(m, v0) for e in ((mc, _lin(p, v)[1]), (self.t[mc], -_lin(p, v)[0]))]

    def limit_pool(self, p: PipeCost, v: int, n: int, need: float, cnt: float) -> None:
        """A bucket's count n (of cnt) in a pool's mode v needs tau_v(T) >= need, so T >= X (X: the T where
        tau_v = need) wherever n > 0: (X - lo) n / cnt <= T - lo."""
        _, _, g, d = _lin(p, v)
        x = (need + d) / g
        if x > self.lo:
            self.rows.add([(n, (x - self.lo) / cnt), (self.T, -1.0)], -np.inf, -self.lo)

    def solve(self, ncol: int, integ: list[int], ub: list[float], time_limit: float):
        """min T: (x or "infeasible" or None, {"dual": HiGHS' dual bound (lo where it has none), "T": x's T})."""
        c = np.zeros(ncol)
        c[self.T] = 1.0
        lb = np.zeros(ncol)
        lb[self.T] = self.lo
        r = self.rows
        A = coo_array((r.vals, (r.rows, r.cols)), shape=(len(r.lo), ncol)).tocsr()
        res = milp(c, constraints=LinearConstraint(A, r.lo, r.hi), integrality=np.array(integ),
                   bounds=Bounds(lb, np.array(ub)), options={"time_limit": float(time_limit), "mip_rel_gap": 1e-7,
                                                            "disp": False})
        if res.status == 2:
            return "infeasible", {}
        dual = getattr(res, "mip_dual_bound", None)
        dual = self.lo if dual is None or not np.isfinite(dual) else float(dual)
        if res.x is None or res.status not in (0, 1):
            return None, {"dual": dual}
        return res.x, {"dual": dual, "T": float(res.x[self.T])}


def pool_min_bound(lengths: np.ndarray, pipes: Sequence[PipeCost], lo: float, hi: float, time_limit: float = 10.0,
                   extra: int = 0, nb: int = NB, whole: int | None = None, counts: bool = False,
                   compact: bool = False) -> float:
    """A lower bound in [lo, hi] from one solve of the min-T model (module doc): hi where no dispatch meets hi, else
    HiGHS' dual bound on min T, valid at a time-out too, times (1 - 1e-6); lo if not above it. `lo` must be a
    proven bound (the model's T starts there). `counts`, `compact`, `extra`, `whole`, `nb`: as pool_feasible's."""
    if not hi > lo or int(np.asarray(lengths).size) == 0:
        return lo
    st, out = pool_solve(lengths, pipes, hi, time_limit, extra, nb, whole, counts, compact, tvar=(lo, hi))
    b = hi if st == "infeasible" else min(hi, out["dual"] if out else lo)
    return max(lo, b * (1 - 1e-6))
