"""Plan side of a step's gap: a large-neighbourhood MILP on the chosen plan (issue 27, decision 123). Prototype.

For each step of one grid cell (planner_grid.probe_steps): the plan of `select_step` and its proven bound
(`proof.lp.prove_selection`). Then, on the chosen candidate (one-stage pipelines, time V c + W), repeatedly: the
slowest pipeline and `k` others (the k fastest, or a random k) are freed; their documents are re-dispatched by a HiGHS
MILP that minimises the largest time among them, with each pipeline's micro-batch count V_j an integer held by
  MaxLen_j V_j >= its tokens,  V_j >= its documents longer than MaxLen_j / 2,  2 V_j >= those longer than MaxLen_j / 3
(bin-packing counts that every packing meets, not every count that meets them packs); each new group is then packed
by the planner's packer (`packing.pack`) and the move kept only if the freed pipelines' largest packed time drops.
`--whole` instead frees every pipeline at once (one MILP on the whole step, its incumbent at the time limit).
`--exact S`: every group is also packed by an exact bin packing (proof.binpack.pack_bins) below the packer's count
when L2 allows fewer; "repacked / plan" is the plan's own dispatch so packed.

Prints per step: plan / bound, the plan after the search / plan (< 1: the MILP found a faster plan: plan-side gap),
the moves kept, and what changed on the pipelines (documents and micro-batches per pipeline before -> after).

    python benchmarks/gap_lns.py --model llama2-13b --cluster a800x16 --source commoncrawl --seeds 0 --steps 0:5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps

from tidal.planner.bounds import PipeCost
from tidal.planner.exact import MilpRows
from tidal.planner.packing import pack
from tidal.planner.select import select_step
from tidal.proof.binpack import l2_bins, pack_bins
from tidal.proof.lp import prove_selection


def regroup(l_: np.ndarray, docs: list[int], pipes: list[PipeCost], limit: float):
    """The MILP of the module doc on `docs` (indices into l_) over `pipes` (one-stage): new groups, or None."""
    n, D = len(docs), len(pipes)
    pairs = [(a, j) for a in range(n) for j in range(D) if l_[docs[a]] <= pipes[j].max_len]
    nx = len(pairs)
    iv, it = nx, nx + D  # V_j columns, then T
    rows = MilpRows()
    s = float(max(l_[docs]))
    for a in range(n):
        rows.add([(k, 1.0) for k, (a2, _) in enumerate(pairs) if a2 == a], 1.0, 1.0)
    for j, p in enumerate(pipes):
        mine = [(k, docs[a]) for k, (a, j2) in enumerate(pairs) if j2 == j]
        rows.add([(k, float(p.w1(float(l_[i])))) for k, i in mine] + [(iv + j, p.c), (it, -1.0)], -np.inf, 0.0)
        rows.add([(k, float(l_[i]) / s) for k, i in mine] + [(iv + j, -p.max_len / s)], -np.inf, 0.0)
        for f, per in ((2, 1.0), (3, 2.0)):
            big = [(k, 1.0) for k, i in mine if l_[i] > p.max_len // f]
            if big:
                rows.add(big + [(iv + j, -per)], -np.inf, 0.0)
    nv = nx + D + 1
    c_obj = np.zeros(nv)
    c_obj[it] = 1.0
    integ = np.ones(nv)
    integ[it] = 0
    ub = np.ones(nv)
    ub[iv:it] = n
    ub[it] = np.inf
    x = rows.solve(c_obj, integ, np.zeros(nv), ub, limit)
    if x is None:
        return None
    groups: list[list[int]] = [[] for _ in range(D)]
    for k, (a, j) in enumerate(pairs):
        if x[k] > 0.5:
            groups[j].append(docs[a])
    return groups


def packed(l_: np.ndarray, g: list[int], p: PipeCost, exact: float = 0.0) -> tuple[float, int]:
    """(packed time, micro-batches) of group g on one-stage p: the planner's packer, then with `exact` > 0 the least
    micro-batch count an exact bin packing finds below it (proof.binpack.pack_bins, `exact` seconds per solve; the
    packing is checked here: every document once, every micro-batch <= MaxLen)."""
    if not g:
        return 0.0, 0
    r = pack(l_[g], p.coeffs, p.pp, p.max_len)
    V = len(r.micro_batches)
    if exact <= 0 or l2_bins(l_[g], p.max_len) >= V:
        return r.est_time, V
    W = float(p.work(l_[g]).sum())
    best = V
    for v in range(V - 1, l2_bins(l_[g], p.max_len) - 1, -1):
        st, bin_of = pack_bins(l_[g], p.max_len, v, exact)
        if st != "feasible":
            break
        assert bin_of.min() >= 0 and np.bincount(bin_of, weights=l_[g], minlength=v).max() <= p.max_len
        best = v
    return (r.est_time, V) if best == V else (best * p.c + W, best)


def search(l_, pipes, groups, k: int, rounds: int, limit: float, rng, whole: bool, exact: float):
    """LNS from `groups`; returns (groups, times, moves kept)."""
    groups = [list(g) for g in groups]
    times = [packed(l_, g, p, exact)[0] for g, p in zip(groups, pipes)]
    kept = 0
    for r in range(1 if whole else rounds):
        order = np.argsort(times)[::-1]
        if whole:
            S = list(range(len(pipes)))
        else:
            others = order[1:][::-1]  # fastest first
            pick = others[:k] if r % 2 == 0 else rng.choice(others, size=min(k, others.size), replace=False)
            S = [int(order[0])] + [int(j) for j in pick]
        docs = [i for j in S for i in groups[j]]
        new = regroup(l_, docs, [pipes[j] for j in S], limit)
        if new is None:
            continue
        nt = [packed(l_, g, pipes[j], exact)[0] for g, j in zip(new, S)]
        if max(nt) < max(times[j] for j in S) * (1 - 1e-9):
            for g, j, t in zip(new, S, nt):
                groups[j], times[j] = g, t
            kept += 1
    return groups, times, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-13b", "a800x16", "commoncrawl", "0", "0:5")
    ap.add_argument("--k", type=int, default=2, help="pipelines freed beside the slowest")
    ap.add_argument("--rounds", type=int, default=30, help="LNS moves tried per step")
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds per MILP")
    ap.add_argument("--whole", action="store_true", help="one MILP over every pipeline instead")
    ap.add_argument("--exact", type=float, default=0.0, metavar="S",
                    help="also pack each group by an exact bin packing below the packer's count (S s per solve)")
    args = ap.parse_args(argv)
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}; "
          f"k {args.k}, rounds {args.rounds}, whole {args.whole}")
    print("| seed | step | docs | chosen | plan / bound | repacked / plan | LNS plan / plan | moves kept "
          "| per pipeline docs/V before -> after | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    gains = []
    for seed, k, l_ in steps:
        sel = prove_selection(l_, profs, select_step(l_, profs, seed=0))
        plan = sel.plan
        prof = profs[plan.strategy]
        pipes = list(prof.pipes)
        if any(p.pp != 1 or p.eq1 for p in pipes):
            print(f"| {seed} | {k} | {l_.size} | {names[plan.strategy]} | - | multi-stage: skipped | | | |")
            continue
        lens = np.asarray(plan.seq_lengths, dtype=np.int64)
        groups = [[i for mb in pp_.micro_batches for i in mb] for pp_ in plan.pipelines]
        t0 = time.perf_counter()
        repack = max(packed(lens, g, p, args.exact)[0] for g, p in zip(groups, pipes))
        new, times, kept = search(lens, pipes, groups, args.k, args.rounds, args.time_limit,
                                  np.random.default_rng(seed * 100 + k), args.whole, args.exact)
        est2 = max(times)
        gains.append(est2 / plan.est_step_time)
        before = " ".join(f"{len(g)}/{len(pp_.micro_batches)}" for g, pp_ in zip(groups, plan.pipelines))
        after = " ".join(f"{len(g)}/{packed(lens, g, p, args.exact)[1]}" for g, p in zip(new, pipes))
        print(f"| {seed} | {k} | {l_.size} | {names[plan.strategy]} | {plan.est_step_time / plan.lower_bound:.4f} "
              f"| {repack / plan.est_step_time:.4f} | {est2 / plan.est_step_time:.4f} | {kept} | {before} -> {after} "
              f"| {time.perf_counter() - t0:.0f} |",
              flush=True)
    if gains:
        print(f"steps {len(gains)}: LNS plan / plan median {np.median(gains):.4f}, min {min(gains):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
