"""The forced-document MILP (issue 27, decision 145): pool.py's question (is there a whole-document dispatch whose every
pipeline's relaxed cost is <= T?) with the short documents' fluid summed over each kind's pipelines instead of kept
per pipeline, so that it solves at 1024 GPUs. `forced_feasible` at one T, `forced_bound` by bisection. Opt-in, after
planning (`proof.lp.prove_selection(forced_s=...)`); the plan never depends on it.

The relaxation, at T. Per kind k (identical PipeCost) with n_k pipelines: cap_k, the largest work capacity C_v of any
mode v (milp.pipe_modes), and tau_k, the largest per-micro-batch limit (mode 1's); a pipeline of kind k whose relaxed
cost is <= T runs some mode v, so its work is <= C_v <= cap_k and each of its documents has c + w <= tau_v <= tau_k
and l <= M_k ("fits k").
- **Forced documents** (those that do not fit every kind; the longest ones): whole, binary x_ij on *slots*, as in
  pool.py: per kind, min(n_k, forced documents that fit k) individually modelled pipelines (those of a dispatch that
  hold a forced document, relabelled), symmetry-broken (the r-th longest uses only the first r + 1 slots of a kind);
  a slot's forced work is <= cap_k.
- **The other documents** as fluid mass per kind, in pool.py's length buckets (count n, tokens t and sum of squares
  Q of the bucket's documents on kind k, with lmin n <= t <= lmax n and lmin t <= Q <= lmax t, each bucket's totals
  exact, so the work a Q + b t + d n is exact for any real split); a bucket may go on kind k where its shortest
  document fits k.
- **Per kind**: the forced work on its slots plus its fluid work is <= n_k cap_k (the sum of its pipelines' rows).
- **Dual feasible function rows** (`dff`, decision 153; none by default): for a function g with sum g(x_i) <= 1
  wherever sum x_i <= 1 (dff_weight: Fekete and Schepers' u^(k) and f_0^lambda), every pipeline of kind k has
  sum over its documents of g(w / cap_k) <= 1 (its work is <= cap_k), so per kind the forced documents' weights plus
  the fluid's are <= n_k, and per slot its forced documents' weights are <= 1. A bucket's documents weigh as its
  shortest does on each kind (the buckets are split where a weight changes form, `dff_edges`; g is non-decreasing).
  These rows count what the summed work rows cannot: e.g. three documents of 0.51 capacities never fit two pipelines.
- **Per-kind form** (`slot_rows=False`): one binary x_ik per forced document and kind, no slot rows: a relaxation of
  the slot form (its rows summed per kind; the dff rows are per kind already) with about 20 times fewer binaries, so
  HiGHS closes it where the slot form times out (decision 153).
Every dispatch of relaxed cost <= T gives a solution, so "infeasible" proves that every plan's step time exceeds T, up
to HiGHS' tolerances (`forced_bound` scales by 1 - 1e-6, as milp.py and pool.py; rows are in seconds and each
bucket's tokens and squares in units of its longest document, so every coefficient is of order 1 or less). It is a
relaxation of pool.py's model at `whole` = the forced documents (its per-slot fluid rows summed with its pool's), and
what is left whole is the bin packing of the forced documents onto the few pipelines they fit: where those are full,
this model sees it and the LP of proof/lp.py does not (decision 145).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.planner.bounds import PipeCost
from tidal.planner.exact import MilpRows
from tidal.proof.milp import bisect_infeasible, pipe_modes
from tidal.proof.pool import NB, Columns, length_buckets

# the dual feasible functions of the per-kind form's rows (dff_weight; module doc): u^(k), k = 1..20, and f_0^lambda,
# lambda = 0.02..0.5 (decision 153: on llama2-7b a800x1024 github seed 1 step 0 its LP relaxation proves the plan /
# 1.0105 with these, 1.015 with k <= 4 and 9 lambdas, and its MILP the plan / 1.0099)
KIND_DFF = tuple(range(1, 21)) + tuple(round(0.02 * j, 2) for j in range(1, 26))


def dff_weight(x: float, f: float) -> tuple[float, float]:
    """A dual feasible function's weight of a document of work x capacities (0 < x <= 1) as (constant, slope): the
    weight is constant + slope x, and the weights of any documents whose work sums to <= one capacity sum to <= 1.
    f >= 1 (a whole k): (ceil((k + 1) x) - 1) / k, at most Fekete and Schepers' u^(k)(x) (equal where (k + 1) x is
    not whole); 0 < f <= 1/2 (a lambda): their f_0^lambda, 1 above 1 - lambda, 0 under lambda, x between. The 1e-9
    only lowers a weight (rounding at a step)."""
    x = min(x, 1.0)
    if f >= 1:
        return max(0.0, (float(np.ceil((f + 1) * x - 1e-9)) - 1.0) / f), 0.0
    if x > 1.0 - f + 1e-9:
        return 1.0, 0.0
    return (0.0, 0.0) if x < f + 1e-9 else (0.0, 1.0)


def dff_edges(short: np.ndarray, ks: Sequence[PipeCost], cap: Sequence[float], dff: Sequence[float]) -> list[int]:
    """The lengths in `short` where some kind's dff_weight (of each f in `dff`) changes form, as bucket edges: a
    bucket then holds documents of one form per kind and f, that of its shortest."""
    u = np.unique(short)
    out: set[int] = set()
    for p, cp in zip(ks, cap):
        if cp <= 0:
            continue
        for f in dff:
            g = [dff_weight(p.w1(float(x)) / cp, f) for x in u]
            out.update(int(u[j + 1]) for j in range(len(u) - 1) if g[j] != g[j + 1])
    return sorted(out)


def forced_feasible(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0,
                    nb: int = NB, dff: Sequence[float] = (), slot_rows: bool = True) -> str:
    """"infeasible" (no whole-document dispatch has every pipeline's relaxed cost <= T: every plan is slower than T,
    up to HiGHS' tolerances), "feasible" (the relaxation has a solution: proves nothing) or "unknown" (time out)."""
    return forced_solve(lengths, pipes, T, time_limit, nb, dff, slot_rows)[0]


def forced_solve(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0,
                 nb: int = NB, dff: Sequence[float] = (), slot_rows: bool = True) -> tuple[str, dict | None]:
    """forced_feasible's status and, when "feasible", the solution for a diagnosis: "order" (document indices, longest
    first), "kinds" (the distinct PipeCosts), "slots" (per slot: its kind's index in "kinds" and the positions in
    "order" of its forced documents), "forced" (how many documents were whole). `dff`: the rows of these dual
    feasible functions (dff_weight's f; module doc); `slot_rows` False: the per-kind form (one "slot" per kind that
    stands for all its pipelines)."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    l_ = np.asarray(lengths, dtype=np.int64)[order]
    if l_.size == 0:
        return "feasible", None
    count: dict[PipeCost, int] = {}
    for p in pipes:
        count[p] = count.get(p, 0) + 1
    ks = list(count)
    cap, tau = [], []
    for p in ks:
        ms = pipe_modes(p, T, int(l_.size))
        cap.append(max(0.0, max((m[1] for m in ms), default=0.0)))
        tau.append(max((m[2] for m in ms), default=-np.inf))
    fits = np.array([[x <= p.max_len and p.c + p.w1(float(x)) <= t for p, t in zip(ks, tau)] for x in l_])
    if not fits.any(axis=1).all():
        return "infeasible", None  # some document fits no pipeline at T
    nbig = int(np.count_nonzero(~fits.all(axis=1)))
    rows = MilpRows()
    cols = Columns()
    dffs = [(ki, k) for ki in range(len(ks)) for k in dff if cap[ki] > 0]
    dterms: list[list[tuple[int, float]]] = [[] for _ in dffs]  # per (kind, k): its documents' DFF weights

    on: list[list[int]] = [[] for _ in range(nbig)]
    slots = []  # (kind index, [(column, position)])
    work: list[list[tuple[int, float]]] = [[] for _ in ks]  # per kind: its forced and fluid work terms (seconds)
    for ki, p in enumerate(ks):
        elig = [i for i in range(nbig) if fits[i, ki]]
        for pos in range(min(count[p], len(elig)) if slot_rows else min(1, len(elig))):
            xs = []
            for i in elig:
                if pos <= i:  # symmetry: the i-th longest uses only the first i + 1 slots of a kind
                    (c,) = cols(1, 1, 1.0)
                    xs.append((c, i))
                    on[i].append(c)
            terms = [(c, p.w1(float(l_[i]))) for c, i in xs]
            if slot_rows:
                rows.add(terms, -np.inf, cap[ki])
            work[ki].extend(terms)
            slots.append((ki, xs))
            for r, (kj, k) in enumerate(dffs):
                if kj == ki:
                    dt = [(c, g0 + g1 * w / cap[ki]) for c, w in terms
                          for g0, g1 in [dff_weight(w / cap[ki], k)] if g0 + g1 * w > 0]
                    dterms[r].extend(dt)
                    if len(dt) > 1 and slot_rows:
                        rows.add(dt, -np.inf, 1.0)  # one slot: its forced documents' weights alone sum to <= 1
    for i in range(nbig):
        rows.add([(c, 1.0) for c in on[i]], 1.0, 1.0)
    for pos in length_buckets(l_[nbig:], [p.max_len + 1 for p in ks] + dff_edges(l_[nbig:], ks, cap, dff), nb):
        bl = l_[nbig + pos].astype(np.float64)
        lmin, u = float(bl.min()), float(bl.max())
        tot = (float(bl.size), float(bl.sum()) / u, float((bl * bl).sum()) / (u * u))
        here = []
        for ki, p in enumerate(ks):
            if lmin <= p.max_len and p.c + p.w1(lmin) <= tau[ki]:
                nc, tc, qc = cols(3, 0, np.inf)
                here.append((nc, tc, qc))
                wt = [(qc, p.a * u * u), (tc, p.b * u)] + ([(nc, p.d)] if p.d else [])  # the bucket's work here
                work[ki].extend(wt)
                for r, (kj, k) in enumerate(dffs):  # each document of the bucket: its shortest's form
                    g0, g1 = dff_weight(p.w1(lmin) / cap[ki], k) if kj == ki else (0.0, 0.0)
                    dterms[r].extend(([(nc, g0)] if g0 else []) + [(c, g1 * v / cap[ki]) for c, v in wt if g1])
                rows.add([(tc, 1.0), (nc, -lmin / u)], 0.0, np.inf)
                rows.add([(tc, 1.0), (nc, -1.0)], -np.inf, 0.0)
                rows.add([(qc, 1.0), (tc, -lmin / u)], 0.0, np.inf)
                rows.add([(qc, 1.0), (tc, -1.0)], -np.inf, 0.0)
        if not here:
            return "infeasible", None
        for j, t in enumerate(tot):
            rows.add([(h[j], 1.0) for h in here], t, t)
    for ki, p in enumerate(ks):
        if work[ki]:
            rows.add(work[ki], -np.inf, count[p] * cap[ki])
    for (ki, _), dt in zip(dffs, dterms):
        if dt:
            rows.add(dt, -np.inf, float(count[ks[ki]]))
    if cols.n == 0:
        return "feasible", None
    x = rows.solve(np.zeros(cols.n), np.array(cols.integ), np.zeros(cols.n), np.array(cols.ub), time_limit,
                   status=True)
    if isinstance(x, str):
        return "infeasible", None
    if x is None:
        return "unknown", None
    return "feasible", {"order": order, "kinds": ks, "forced": nbig,
                        "slots": [(ki, [i for c, i in xs if x[c] > 0.5]) for ki, xs in slots]}


def forced_bound(lengths: np.ndarray, pipes: Sequence[PipeCost], lo: float, hi: float, time_limit: float = 10.0,
                 iters: int = 4, gap: float = 1e-3, nb: int = NB, dff: Sequence[float] = (),
                 slot_rows: bool = True) -> float:
    """The largest T in (lo, hi) at which forced_feasible (`dff`, `slot_rows`) answers "infeasible", times
    (1 - 1e-6), or lo: first at hi / (1 + gap), then `iters` bisection steps between lo and it
    (milp.bisect_infeasible)."""
    if int(np.asarray(lengths).size) == 0:
        return lo
    return bisect_infeasible(lambda T: forced_feasible(lengths, pipes, T, time_limit, nb, dff, slot_rows)
                             == "infeasible", lo, hi, iters, gap)[0]
