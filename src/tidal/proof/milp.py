"""The MILP over whole-document dispatches (issue 27, decision 108): is there a dispatch whose every pipeline's relaxed
cost is <= T (`dispatch_feasible`), and the largest T it proves infeasible by bisection (`milp_bound`). Opt-in, after
planning (`tidal.proof.lp.prove_selection(milp_s=...)`, benchmarks/gap_exact.py); the plan never depends on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tidal.planner.bounds import PipeCost
from tidal.planner.exact import MilpRows, columns_by


def pipe_modes(p: PipeCost, T: float, vmax: int) -> list[tuple[int, float, float]]:
    """(v, work capacity C_v, per-micro-batch limit tau_v) of pipeline `p` at time T, for v = 1.. `vmax` while
    tau_v >= c: tau_v is what one micro-batch may take in mode v; one stage (q = 0) sums its micro-batches
    (decision 94). Shared by this MILP and the pooled one (proof/pool.py)."""
    ms = []
    for v in range(1, vmax + 1):
        tau = T / (p.q + v) if p.q > 0 else T - (v - 1) * p.c
        cap = v * (tau - p.c) if p.q > 0 else T - v * p.c
        if tau < p.c:
            break
        ms.append((v, cap, tau))
    return ms


def dispatch_feasible(lengths: np.ndarray, pipes: Sequence[PipeCost], T: float, time_limit: float = 30.0):
    """Is there a dispatch (every document whole on one pipeline) whose every pipeline's relaxed cost is <= T? The
    relaxed cost is bounds.pipeline_bound's: min over V in [ceil(tokens / MaxLen), count] of (q + V) max(W / V + c,
    c + w_max) (q = 0: V c + W). A HiGHS MILP at fixed T (issue 27, decision 108): x_ij (document i on pipeline j),
    z_jv (pipeline j runs v micro-batches, at most one v), with
      sum_j x_ij = 1;  sum_i w_ij x_ij <= sum_v C_jv z_jv;  sum_i l_i x_ij <= M_j sum_v v z_jv;
      sum_v v z_jv <= sum_i x_ij;  x_ij <= sum of z_jv over the modes v where c_j + w_ij <= tau_jv,
    tau_jv = T / (q_j + v) and C_jv = v (tau_jv - c_j) (q_j = 0: tau_jv = T - (v - 1) c_j, C_jv = T - v c_j). The
    relaxed cost is <= T exactly when some such v exists, so the MILP is exact for it, and the relaxed cost is at most
    any packing's time. q_j is PipeCost.q: a one-stage Hydraulis Eq. 1 pipeline counts its slowest micro-batch
    (tighter than pipeline_bound, which sums them; still at most its packed time). Identical pipelines are
    interchangeable: the r-th longest document may only use the first r + 1 of each run of identical pipelines
    (symmetry breaking). Returns ("infeasible", None): no such dispatch, so every plan's estimate exceeds T (up to
    HiGHS' tolerances); ("feasible", groups); or ("unknown", None) when `time_limit` seconds ran out."""
    l_ = np.asarray(lengths, dtype=np.int64)
    n, D = l_.size, len(pipes)
    order = np.argsort(-l_, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    first: dict[PipeCost, int] = {}
    pos = []  # index of each pipeline within its run of identical pipelines
    for p in pipes:
        pos.append(first.get(p, 0))
        first[p] = pos[-1] + 1
    modes = [pipe_modes(p, T, n) for p in pipes]  # per pipeline: (v, capacity, tau) for the modes with capacity >= 0
    pairs = []
    for i in range(n):
        for j, p in enumerate(pipes):
            if l_[i] <= p.max_len and pos[j] <= rank[i] and modes[j] and p.c + p.w1(float(l_[i])) <= modes[j][0][2]:
                pairs.append((i, j))
    by_i, by_j = columns_by(pairs, n, D)
    if any(not cols for cols in by_i):
        return "infeasible", None
    zcol: list[list[int]] = []
    nv = len(pairs)
    for j in range(D):
        zcol.append(list(range(nv, nv + len(modes[j]))))
        nv += len(modes[j])
    rows = MilpRows()
    for i in range(n):
        rows.add([(k, 1.0) for k in by_i[i]], 1.0, 1.0)
    for j, p in enumerate(pipes):
        if not modes[j]:
            continue
        zs = list(zip(zcol[j], modes[j]))
        rows.add([(z, 1.0) for z, _ in zs], 0.0, 1.0)
        wk = [(k, p.w1(float(l_[pairs[k][0]]))) for k in by_j[j]]
        rows.add(wk + [(z, -cap) for z, (_, cap, _) in zs], -np.inf, 0.0)
        rows.add([(k, float(l_[pairs[k][0]])) for k in by_j[j]] + [(z, -float(p.max_len) * v) for z, (v, _, _) in zs],
                 -np.inf, 0.0)
        rows.add([(z, float(v)) for z, (v, _, _) in zs] + [(k, -1.0) for k in by_j[j]], -np.inf, 0.0)
        for k, w in wk:
            rows.add([(k, 1.0)] + [(z, -1.0) for z, (v, _, tau) in zs if p.c + w <= tau], -np.inf, 0.0)
    c_obj = np.zeros(nv)
    x = rows.solve(c_obj, np.ones(nv), np.zeros(nv), np.ones(nv), time_limit, status=True)
    if isinstance(x, str):
        return "infeasible", None
    if x is None:
        return "unknown", None
    groups: list[list[int]] = [[] for _ in range(D)]
    for k, (i, j) in enumerate(pairs):
        if x[k] > 0.5:
            groups[j].append(i)
    return "feasible", tuple(tuple(sorted(g)) for g in groups)


def bisect_infeasible(infeasible: Callable[[float], bool], lo: float, hi: float, iters: int = 4,
                      gap: float = 1e-3) -> tuple[float, float, float]:
    """The MILP bounds' one search (milp_bound, pool.pool_bound, forced.forced_bound): `infeasible(T)` first at
    hi / (1 + gap), then `iters` bisection steps between lo and it. Returns (bound, a, b): bound = the largest T found
    infeasible times (1 - 1e-6) (HiGHS' tolerances), or lo; [a, b] = [proven (or lo), first not proven]."""
    T = hi / (1 + gap)
    if not hi > lo or lo >= T:
        return lo, lo, hi
    if infeasible(T):
        return T * (1 - 1e-6), T, hi
    a, b = lo, T  # a: proven (or lo); b: not proven
    for _ in range(iters):
        m = 0.5 * (a + b)
        if infeasible(m):
            a = m
        else:
            b = m
    return (a * (1 - 1e-6) if a > lo else lo), a, b


def milp_bound(lengths: np.ndarray, pipes: Sequence[PipeCost], lo: float, hi: float, time_limit: float = 5.0,
               iters: int = 4, gap: float = 1e-3, max_pairs: int = 5000) -> float:
    """The largest T in (lo, hi) at which dispatch_feasible proves that no whole-document dispatch fits, times
    (1 - 1e-6) (HiGHS' tolerances), or lo (decision 108): first at hi / (1 + gap), then by `iters` bisection steps
    between lo and it, each MILP within `time_limit` seconds (a timed-out one proves nothing). Skipped (lo) when
    documents x pipelines exceeds `max_pairs`: the MILP is for steps of a few documents per pipeline."""
    n = int(np.asarray(lengths).size)
    if n == 0 or n * len(pipes) > max_pairs:
        return lo
    return bisect_infeasible(lambda T: dispatch_feasible(lengths, pipes, T, time_limit)[0] == "infeasible",
                             lo, hi, iters, gap)[0]
