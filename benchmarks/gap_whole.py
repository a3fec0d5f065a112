"""Plan side of a step's gap, on the whole step: one MILP over every pipeline, packed exactly (issue 27, decision 129).

For each step of one grid cell (planner_grid.probe_steps) whose chosen candidate has one-stage pipelines only (time
V c + W): every document on one pipeline (binary x_ij, the r-th longest may use only the first r + 1 pipelines of a
run of identical ones), each pipeline's micro-batch count V_j a free integer, minimising T subject to
  W_j + c_j V_j <= T,  tokens_j <= MaxLen_j V_j,  V_j <= documents_j,
  the count rows (documents longer than MaxLen / 2 at most 1 per micro-batch, longer than MaxLen / 3 at most 2),
  and (--dff) the rows sum_i f(l_i / MaxLen_j) x_ij <= V_j for the dual-feasible functions f of Fekete and Schepers
  (U_e: 1 above 1 - e, x on [e, 1 - e], 0 below e; phi_e: 1 - floor((1 - x) / e) / floor(1 / e) above 1/2,
  1 / floor(1 / e) on [e, 1/2], 0 below e): each holds for every packing into V_j micro-batches.
Its incumbent at the time limit is then packed exactly into V_j micro-batches per pipeline (proof.binpack.pack_bins,
--pack-s seconds per solve); a pipeline that does not pack hands its shortest document to the pipeline with the most
time to spare that has token room, and packs again (at most --moves times). The packed plan is checked (every
document once, every micro-batch <= MaxLen) and its time, max_j of the sum over its micro-batches of c_j + work, is
printed against the plan's estimate: "packed / plan" < 1 is a faster plan, so that much of the gap is the plan's.
HiGHS' dual bound at the time limit is a lower bound on every packed plan of the candidate (the rows hold for every
packing), printed too; it proves nothing about other candidates.

    cd benchmarks && python gap_whole.py --model llama2-13b --cluster a800x16 --source flanv2 --seeds 0 --steps 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from tidal.planner.exact import MilpRows
from tidal.planner.select import select_step
from tidal.proof.binpack import pack_bins
from tidal.proof.lp import prove_selection

DFF = [("U", e) for e in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)] + \
      [("phi", e) for e in (1 / 3, 1 / 4, 1 / 5, 1 / 6, 1 / 8)]


def dff(name: str, lengths: np.ndarray, cap: int, e: float) -> np.ndarray:
    """f(l / cap) of the dual-feasible function `name` ("U" or "phi", module doc) with parameter e <= 1/2."""
    x = np.asarray(lengths, dtype=np.float64) / cap
    if name == "U":
        return np.where(x > 1 - e, 1.0, np.where(x >= e, x, 0.0))
    F = np.floor(1 / e + 1e-12)
    return np.where(x > 0.5, 1 - np.floor((1 - x) / e + 1e-12) / F, np.where(x >= e, 1 / F, 0.0))


def whole_milp(l_: np.ndarray, pipes, limit: float, use_dff: bool):
    """The module doc's MILP: (groups, V, incumbent T, dual bound), groups None when no incumbent was found."""
    rank = np.empty(l_.size, dtype=np.int64)
    rank[np.argsort(-l_, kind="stable")] = np.arange(l_.size)
    first: dict = {}
    pos = [j - first.setdefault(p, j) for j, p in enumerate(pipes)]
    pairs = [(i, j) for i in range(l_.size) for j, p in enumerate(pipes) if l_[i] <= p.max_len and pos[j] <= rank[i]]
    D, nx = len(pipes), len(pairs)
    iv, it = nx, nx + D
    by_i: list[list[int]] = [[] for _ in range(l_.size)]
    by_j: list[list[int]] = [[] for _ in range(D)]
    for q, (i, j) in enumerate(pairs):
        by_i[i].append(q)
        by_j[j].append(q)
    rows, s = MilpRows(), float(l_.max())
    for qs in by_i:
        rows.add([(q, 1.0) for q in qs], 1.0, 1.0)
    for j, p in enumerate(pipes):
        lj = l_[[pairs[q][0] for q in by_j[j]]]
        rows.add([(q, p.w1(float(x))) for q, x in zip(by_j[j], lj)] + [(iv + j, p.c), (it, -1.0)], -np.inf, 0.0)
        rows.add([(q, float(x) / s) for q, x in zip(by_j[j], lj)] + [(iv + j, -p.max_len / s)], -np.inf, 0.0)
        rows.add([(iv + j, 1.0)] + [(q, -1.0) for q in by_j[j]], -np.inf, 0.0)
        fs = [np.where(lj > p.max_len // f, 1.0 / per, 0.0) for f, per in ((2, 1), (3, 2))]
        fs += [dff(nm, lj, p.max_len, e) for nm, e in DFF] if use_dff else []
        for fv in fs:
            if fv.any():
                rows.add([(q, float(v)) for q, v in zip(by_j[j], fv) if v > 0] + [(iv + j, -1.0)], -np.inf, 0.0)
    nv = it + 1
    cobj, integ, ub = np.zeros(nv), np.ones(nv), np.ones(nv)
    cobj[it], integ[it], ub[iv:it], ub[it] = 1.0, 0, l_.size, np.inf
    A = coo_array((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.lo), nv)).tocsr()
    res = milp(cobj, constraints=LinearConstraint(A, rows.lo, rows.hi), integrality=integ,
               bounds=Bounds(np.zeros(nv), ub), options={"time_limit": limit, "mip_rel_gap": 1e-7, "disp": False})
    dual = float(getattr(res, "mip_dual_bound", np.nan) or np.nan)
    if res.x is None:
        return None, None, np.nan, dual
    groups: list[list[int]] = [[] for _ in range(D)]
    for q, (i, j) in enumerate(pairs):
        if res.x[q] > 0.5:
            groups[j].append(i)
    return groups, [int(round(res.x[iv + j])) for j in range(D)], float(res.x[it]), dual


def pack_all(l_: np.ndarray, pipes, groups, V, pack_s: float, moves: int):
    """Every group packed exactly into its V_j micro-batches, repaired as the module doc says: (checked step time,
    moves made), or (nan, moves) when a pipeline still does not pack."""
    groups = [list(g) for g in groups]

    def t(j):
        return V[j] * pipes[j].c + float(pipes[j].work(l_[groups[j]]).sum())

    bins: list = [None] * len(pipes)
    made = 0
    while True:
        todo = [j for j in range(len(pipes)) if bins[j] is None]
        if not todo:
            break
        j = todo[0]
        st, b = pack_bins(l_[groups[j]], pipes[j].max_len, V[j], pack_s)
        if st == "feasible":
            bins[j] = b
            continue
        i = min(groups[j], key=lambda i: l_[i])
        to = [o for o in range(len(pipes)) if o != j and l_[i] <= pipes[o].max_len
              and int(l_[groups[o]].sum()) + l_[i] <= pipes[o].max_len * V[o]]
        if made >= moves or not to:
            return np.nan, made
        o = min(to, key=t)
        groups[j].remove(i)
        groups[o].append(i)
        bins[o] = None
        made += 1
    assert sorted(i for g in groups for i in g) == list(range(l_.size)), "every document exactly once"
    worst = 0.0
    for g, b, v, p in zip(groups, bins, V, pipes):
        mbs = [np.asarray(g, dtype=np.int64)[b == k] for k in range(v)]
        assert all(int(l_[m].sum()) <= p.max_len for m in mbs)
        worst = max(worst, sum(p.c + float(p.work(l_[m]).sum()) for m in mbs if m.size))
    return worst, made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-13b", "a800x16", "flanv2", "0", "4")
    ap.add_argument("--time-limit", type=float, default=90.0, help="seconds for the whole-step MILP")
    ap.add_argument("--dff", action="store_true", help="also the dual-feasible-function rows (module doc)")
    ap.add_argument("--pack-s", type=float, default=60.0, help="seconds per exact bin packing")
    ap.add_argument("--moves", type=int, default=8, help="repair moves allowed per step")
    ap.add_argument("--all", action="store_true", help="every one-stage candidate, not only the chosen one")
    ap.add_argument("--pool-s", type=float, default=0.0,
                    help="the bound: prove_selection with the pooled MILP and its count rows (--pool-counts), S s "
                         "per solve; 0: the LP proof")
    args = ap.parse_args(argv)
    if not (args.time_limit > 0 and args.pack_s > 0 and args.moves >= 0 and args.pool_s >= 0):
        raise SystemExit(f"error: --time-limit and --pack-s must be > 0, --moves and --pool-s >= 0; got "
                         f"{args.time_limit}, {args.pack_s}, {args.moves}, {args.pool_s}")
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}; MILP "
          f"{args.time_limit:g} s, dff {args.dff}, exact packing {args.pack_s:g} s per pipeline")
    print("| seed | step | docs | plan cand | plan / bound | candidate | MILP T / plan | dual bound / plan | V | "
          "packed / plan | packed / bound | moves | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for seed, k, l_ in steps:
        sel = prove_selection(l_, profs, select_step(l_, profs, seed=0), pool_s=args.pool_s,
                              pool_counts=args.pool_s > 0)
        est, lb = sel.plan.est_step_time, sel.plan.lower_bound
        for ci, prof in enumerate(profs):
            if not args.all and ci != sel.plan.strategy:
                continue
            pipes = list(prof.pipes)
            if any(p.pp != 1 or p.eq1 for p in pipes) or int(l_.max()) > max(p.max_len for p in pipes):
                continue
            t0 = time.perf_counter()
            groups, V, T, dual = whole_milp(l_, pipes, args.time_limit, args.dff)
            got, made = pack_all(l_, pipes, groups, V, args.pack_s, args.moves) if groups else (np.nan, 0)
            print(f"| {seed} | {k} | {l_.size} | {names[sel.plan.strategy]} | {est / lb:.4f} | {names[ci]} | "
                  f"{T / est:.4f} | {dual / est:.4f} | {V} | {got / est:.4f} | {got / lb:.4f} | {made} | "
                  f"{time.perf_counter() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
