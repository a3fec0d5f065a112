"""Exact modes: HiGHS MILPs (scipy.optimize.milp) for dispatch (Eq. 3 with our Eq. 2) and fixed-V packing (Eq. 1).

Meant for small instances (tests, differential checks, offline audits): both grow with sequences x pipelines/bins.
Each returns None when HiGHS finds no feasible solution within `time_limit` seconds. `MilpRows` and `columns_by` also
build tidal.proof.milp's MILP (the bound proven after planning).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from tidal.planner.bounds import PipeCost


class MilpRows:
    """The constraint rows of a MILP, lower <= sum of (column, value) entries <= upper, one `add` per row."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, entries, lower: float, upper: float) -> None:
        r = len(self.lo)
        for col, v in entries:
            self.rows.append(r)
            self.cols.append(col)
            self.vals.append(float(v))
        self.lo.append(lower)
        self.hi.append(upper)

    def solve(self, c_obj, integrality, lb, ub, time_limit, status: bool = False):
        """The solution, or None; with `status`, "infeasible" when HiGHS proves that no solution exists."""
        A = coo_array((self.vals, (self.rows, self.cols)), shape=(len(self.lo), len(c_obj))).tocsr()
        res = milp(c_obj, constraints=LinearConstraint(A, self.lo, self.hi), integrality=integrality,
                   bounds=Bounds(lb, ub), options={"time_limit": float(time_limit), "mip_rel_gap": 1e-7, "disp": False})
        if status and res.status == 2:
            return "infeasible"
        return res.x if res.x is not None and res.status in (0, 1) else None


def columns_by(pairs, n: int, m: int) -> tuple[list[list[int]], list[list[int]]]:
    """The assignment columns (indices into `pairs`) of each sequence i < n and of each pipeline or bin j < m."""
    by_i: list[list[int]] = [[] for _ in range(n)]
    by_j: list[list[int]] = [[] for _ in range(m)]
    for col, (i, j) in enumerate(pairs):
        by_i[i].append(col)
        by_j[j].append(col)
    return by_i, by_j


def dispatch_milp(lengths: np.ndarray, pipes: Sequence[PipeCost], time_limit: float = 10.0):
    """min T  s.t.  sum_j m_ij = 1 (eligible j only); MaxLen_j V_j >= sum_i l_i m_ij (V_j integer);
    E_j >= (c_j + w_j(l_i)) m_ij;  T >= sum_i w_j(l_i) m_ij + c_j V_j + (PP_j - 1) E_j.
    Identical pipelines are ordered by token load (symmetry breaking). Returns groups (per pipeline, sorted indices)."""
    l_ = np.asarray(lengths, dtype=np.int64)
    n, D = l_.size, len(pipes)
    pairs = [(i, j) for i in range(n) for j in range(D) if l_[i] <= pipes[j].max_len]
    nm = len(pairs)
    iv = nm  # V_j at iv + j, E_j at ie + j, T at it
    ie = nm + D
    it = nm + 2 * D
    nv = it + 1
    rows = MilpRows()
    add = rows.add
    by_i, by_j = columns_by(pairs, n, D)
    for i in range(n):
        add([(k, 1.0) for k in by_i[i]], 1.0, 1.0)
    for j, p in enumerate(pipes):
        add([(iv + j, p.max_len)] + [(k, -float(l_[pairs[k][0]])) for k in by_j[j]], 0.0, np.inf)
        work = []
        for k in by_j[j]:
            x = float(l_[pairs[k][0]])
            wx = p.w1(x)
            add([(ie + j, 1.0), (k, -(p.c + wx))], 0.0, np.inf)
            work.append((k, -wx))
        add([(it, 1.0), (iv + j, -p.c), (ie + j, -(p.pp - 1.0))] + work, 0.0, np.inf)
    for j in range(D):
        for j2 in range(j + 1, D):
            if pipes[j2] == pipes[j]:
                add([(k, float(l_[pairs[k][0]])) for k in by_j[j]] + [(k, -float(l_[pairs[k][0]])) for k in by_j[j2]],
                    0.0, np.inf)
                break  # chain j >= next identical >= ...
    c_obj = np.zeros(nv)
    c_obj[it] = 1.0
    integrality = np.zeros(nv)
    integrality[:nm] = 1
    integrality[iv:iv + D] = 1
    lb = np.zeros(nv)
    ub = np.full(nv, np.inf)
    ub[:nm] = 1.0
    ub[iv:iv + D] = max(n, 1)
    x = rows.solve(c_obj, integrality, lb, ub, time_limit)
    if x is None:
        return None
    groups: list[list[int]] = [[] for _ in range(D)]
    for k, (i, j) in enumerate(pairs):
        if x[k] > 0.5:
            groups[j].append(i)
    if sum(len(g) for g in groups) != n:
        return None
    return tuple(tuple(sorted(g)) for g in groups)


def pack_milp_fixed_v(lengths: np.ndarray, work: np.ndarray, V: int, max_len: int, c: float,
                      time_limit: float = 10.0) -> np.ndarray | None:
    """min T_mb  s.t.  sum_k o_ik = 1;  sum_i l_i o_ik <= MaxLen;  c + sum_i w_i o_ik <= T_mb, with the r-th longest
    sequence restricted to micro-batches k <= r (symmetry breaking). Returns the micro-batch of every sequence."""
    l_ = np.asarray(lengths, dtype=np.int64)
    n = l_.size
    order = np.argsort(-l_, kind="stable")
    pairs = [(int(i), k) for r_, i in enumerate(order.tolist()) for k in range(min(V, r_ + 1))]
    nm = len(pairs)
    it = nm
    rows = MilpRows()
    by_i, by_k = columns_by(pairs, n, V)
    for i in range(n):
        rows.add([(q, 1.0) for q in by_i[i]], 1.0, 1.0)
    for k in range(V):
        rows.add([(q, l_[pairs[q][0]]) for q in by_k[k]], -np.inf, float(max_len))
        rows.add([(q, -float(work[pairs[q][0]])) for q in by_k[k]] + [(it, 1.0)], c, np.inf)
    c_obj = np.zeros(nm + 1)
    c_obj[it] = 1.0
    integrality = np.ones(nm + 1)
    integrality[it] = 0
    lb = np.zeros(nm + 1)
    ub = np.ones(nm + 1)
    ub[it] = np.inf
    x = rows.solve(c_obj, integrality, lb, ub, time_limit)
    if x is None:
        return None
    bin_of = np.full(n, -1, dtype=np.int64)
    for q, (i, k) in enumerate(pairs):
        if x[q] > 0.5:
            bin_of[i] = k
    return None if np.any(bin_of < 0) else bin_of
