"""Micro-batch counts of one pipeline's documents (issue 27, decision 123): the least number of micro-batches of at
most MaxLen tokens that hold them, a bin-packing problem. `l2_bins` is Martello and Toth's L2 lower bound (sound, in
numpy); `min_bins` the exact count by a HiGHS MILP (opt-in diagnosis and proof, never in the plan).

A one-stage pipeline's time is V c + W (decision 94): for a fixed set of documents, a packing is optimal exactly when
its V is the least count.
"""

from __future__ import annotations

import numpy as np

from tidal.planner.exact import MilpRows, columns_by


def l2_bins(lengths, cap: int) -> int:
    """Martello-Toth L2: for every K in [0, cap / 2], the documents longer than cap - K each need a micro-batch of their
    own; those in (cap / 2, cap - K] too, and the documents in [K, cap / 2] fit only in what the latter leave free
    or in new micro-batches. The max over K (K at 0 and at every length <= cap / 2) is a lower bound on the count."""
    l_ = np.sort(np.asarray(lengths, dtype=np.int64))
    if l_.size == 0:
        return 0
    best = -(-int(l_.sum()) // cap)
    cs = np.concatenate([[0], np.cumsum(l_)])
    for K in np.unique(np.concatenate([[0], l_[2 * l_ <= cap]])).tolist():
        i1 = int(np.searchsorted(l_, cap - K, side="right"))  # l > cap - K from i1
        i2 = int(np.searchsorted(l_, cap // 2, side="right"))  # l > cap / 2 from i2
        i3 = int(np.searchsorted(l_, K, side="left"))  # l >= K from i3
        n1, n2 = l_.size - i1, max(0, i1 - i2)
        free = n2 * cap - int(cs[i1] - cs[i2]) if n2 else 0
        s3 = int(cs[i2] - cs[i3]) if i2 > i3 else 0
        best = max(best, n1 + n2 + max(0, -(-(s3 - free) // cap)))
    return best


def fits_bins(lengths, cap: int, V: int, time_limit: float = 10.0) -> str:
    """Do the documents fit in V micro-batches of at most `cap` tokens? "feasible", "infeasible" (HiGHS' word) or
    "unknown" (time out). Symmetry broken: the r-th longest document uses only the first r + 1 micro-batches."""
    return pack_bins(lengths, cap, V, time_limit)[0]


def pack_bins(lengths, cap: int, V: int, time_limit: float = 10.0) -> tuple[str, np.ndarray | None]:
    """fits_bins' status and, when "feasible", the micro-batch (0 .. V - 1) of every document."""
    l_ = np.asarray(lengths, dtype=np.int64)
    n = l_.size
    if n == 0:
        return "feasible", np.zeros(0, dtype=np.int64)
    if V <= 0 or int(l_.max()) > cap or l2_bins(l_, cap) > V:
        return "infeasible", None
    if n <= V:
        return "feasible", np.arange(n, dtype=np.int64)
    if int(l_.sum()) <= cap:
        return "feasible", np.zeros(n, dtype=np.int64)
    order = np.argsort(-l_, kind="stable")
    pairs = [(int(i), k) for r, i in enumerate(order.tolist()) for k in range(min(V, r + 1))]
    by_i, by_k = columns_by(pairs, n, V)
    rows = MilpRows()
    s = float(cap)
    for i in range(n):
        rows.add([(q, 1.0) for q in by_i[i]], 1.0, 1.0)
    for k in range(V):
        rows.add([(q, float(l_[pairs[q][0]]) / s) for q in by_k[k]], -np.inf, 1.0)
    nv = len(pairs)
    x = rows.solve(np.zeros(nv), np.ones(nv), np.zeros(nv), np.ones(nv), time_limit, status=True)
    if isinstance(x, str):
        return "infeasible", None
    if x is None:
        return "unknown", None
    bin_of = np.full(n, -1, dtype=np.int64)
    for q, (i, k) in enumerate(pairs):
        if x[q] > 0.5:
            bin_of[i] = k
    return "feasible", bin_of


def min_bins(lengths, cap: int, time_limit: float = 10.0, upper: int | None = None) -> tuple[int, str]:
    """(count, status): the least number of micro-batches of at most `cap` tokens that hold the documents, searched
    down from `upper` (a known count, e.g. a packing's) to l2_bins. status "optimal" (every smaller count proven
    infeasible, or the L2 bound met) or "unknown" (a solve timed out: count is the least found)."""
    l_ = np.asarray(lengths, dtype=np.int64)
    lo = l2_bins(l_, cap)
    V = int(l_.size) if upper is None else int(upper)
    while lo < V:
        st = fits_bins(l_, cap, V - 1, time_limit)
        if st == "feasible":
            V -= 1
        elif st == "infeasible":
            return V, "optimal"
        else:
            return V, "unknown"
    return V, "optimal"
