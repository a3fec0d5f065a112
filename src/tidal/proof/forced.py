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


def forced_feasible(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0,
                    nb: int = NB) -> str:
    """"infeasible" (no whole-document dispatch has every pipeline's relaxed cost <= T: every plan is slower than T,
    up to HiGHS' tolerances), "feasible" (the relaxation has a solution: proves nothing) or "unknown" (time out)."""
    return forced_solve(lengths, pipes, T, time_limit, nb)[0]


def forced_solve(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0,
                 nb: int = NB) -> tuple[str, dict | None]:
    """forced_feasible's status and, when "feasible", the solution for a diagnosis: "order" (document indices, longest
    first), "kinds" (the distinct PipeCosts), "slots" (per slot: its kind's index in "kinds" and the positions in
    "order" of its forced documents), "forced" (how many documents were whole)."""
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

    on: list[list[int]] = [[] for _ in range(nbig)]
    slots = []  # (kind index, [(column, position)])
    work: list[list[tuple[int, float]]] = [[] for _ in ks]  # per kind: its forced and fluid work terms (seconds)
    for ki, p in enumerate(ks):
        elig = [i for i in range(nbig) if fits[i, ki]]
        for pos in range(min(count[p], len(elig))):
            xs = []
            for i in elig:
                if pos <= i:  # symmetry: the i-th longest uses only the first i + 1 slots of a kind
                    (c,) = cols(1, 1, 1.0)
                    xs.append((c, i))
                    on[i].append(c)
            terms = [(c, p.w1(float(l_[i]))) for c, i in xs]
            rows.add(terms, -np.inf, cap[ki])
            work[ki].extend(terms)
            slots.append((ki, xs))
    for i in range(nbig):
        rows.add([(c, 1.0) for c in on[i]], 1.0, 1.0)
    for pos in length_buckets(l_[nbig:], [p.max_len + 1 for p in ks], nb):
        bl = l_[nbig + pos].astype(np.float64)
        lmin, u = float(bl.min()), float(bl.max())
        tot = (float(bl.size), float(bl.sum()) / u, float((bl * bl).sum()) / (u * u))
        here = []
        for ki, p in enumerate(ks):
            if lmin <= p.max_len and p.c + p.w1(lmin) <= tau[ki]:
                nc, tc, qc = cols(3, 0, np.inf)
                here.append((nc, tc, qc))
                work[ki].extend([(qc, p.a * u * u), (tc, p.b * u)] + ([(nc, p.d)] if p.d else []))
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
                 iters: int = 4, gap: float = 1e-3, nb: int = NB) -> float:
    """The largest T in (lo, hi) at which forced_feasible answers "infeasible", times (1 - 1e-6), or lo: first at
    hi / (1 + gap), then `iters` bisection steps between lo and it (milp.bisect_infeasible)."""
    if int(np.asarray(lengths).size) == 0:
        return lo
    return bisect_infeasible(lambda T: forced_feasible(lengths, pipes, T, time_limit, nb) == "infeasible",
                             lo, hi, iters, gap)[0]
