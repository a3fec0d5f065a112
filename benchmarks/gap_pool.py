"""How far the pooled MILP (proof.pool, decision 118) raises the proven bound of large steps, and at what cost.

For each step of one grid cell (benchmarks/planner_grid.py: same candidates, tokens per step and sources): the plan of
`select_step`, the step bound after `proof.lp.prove_selection` (what `planner.py --grid --prove` reports), and after
`prove_selection(..., pool_s=S)` (the pooled MILP on every candidate still under the plan, S seconds per HiGHS solve),
with the proof's CPU time (thread_time) beside the LP proof's. "closed" counts the steps whose proven gap ends <= 1 %.
A bound that rises to the plan puts that step's gap in the bound; one that stays under it leaves the gap open (the
relaxation is feasible there, or a solve timed out: "unknown" proves nothing).

With --variants plain,counts,rows: the pooled proof is run once per variant on each step, each with its own bound and
CPU column: plain (decision 118), counts (its micro-batch count rows and compact one-stage encoding,
`prove_selection(..., pool_counts=True)`, decision 123), rows (the count rows on the modes' encoding, no compact:
`pool_bound(counts=True, compact=False)` on the LP-proven selection's candidates, in prove_selection's order and rule;
--rows-iters bisection steps), min (decision 128: `pool_min_bound`, HiGHS' dual bound of the min-T model, with the count
rows, compact encoding, then the modes' where still under), rowsmin (rows with 4 bisection steps and `finish=True`: one
min-T solve on the interval they leave). "best" then takes, per candidate, the highest of the variants' bounds (each is
sound) and the least of those over the candidates: the step bound a proof running every variant would give (decision
126).

With --round: where the relaxation is feasible (at the plan's estimate / 1.001 and at the (best) pooled bound x 1.01, on
each candidate still under the plan), its solution is rounded to a whole-document dispatch (`rounded`: each bucket's
fluid counts by largest remainder; a pool's documents spread longest first onto its least-loaded pipeline) and
packed (`packing.pack`); "rounded / plan" < 1 is a faster plan, so a gap on the plan's side.

    cd benchmarks && python gap_pool.py --model llama2-7b --cluster a800x256 --source github --seeds 10 --steps 0:3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps

from tidal.planner.dispatch import owner_result
from tidal.planner.packing import pack
from tidal.planner.select import select_step
from tidal.proof.lp import GAP, prove_selection
from tidal.proof.pool import pool_bound, pool_min_bound, pool_solve

VARIANTS = ("plain", "counts", "rows", "min", "rowsmin")


def _min_both(l_, pipes, lo, hi, pool_s):
    """pool_min_bound with the count rows, compact encoding, then the modes' where still under (module doc, "min")."""
    b = pool_min_bound(l_, pipes, lo, hi, pool_s, counts=True, compact=True)
    if b * (1 + GAP) < hi:
        b = max(b, pool_min_bound(l_, pipes, b, hi, pool_s, counts=True, compact=False))
    return b


def _rows_finish(l_, pipes, lo, hi, pool_s, iters: int = 4):
    """The rows variant's pool_bound with one min-T solve on the interval it leaves (module doc, "rowsmin")."""
    return pool_bound(l_, pipes, lo, hi, pool_s, iters, counts=True, compact=False, finish=True)


def prove_rows(l_: np.ndarray, profs, lp_sel, pool_s: float, iters: int = 4, bound=None):
    """The LP-proven selection `lp_sel` with `pool_bound(counts=True, compact=False)` where prove_selection would run
    the pooled MILP (same order, same rule; `iters` bisection steps, prove_selection's 4 by default); the candidates'
    bounds and the step bound (module doc, "rows"). `bound(l_, pipes, lo, hi, pool_s)`: that bound instead."""
    est, reports, lb = lp_sel.plan.est_step_time, [r.lower_bound for r in lp_sel.strategies], float("inf")
    for i in sorted(range(len(reports)), key=lambda i: (reports[i], i)):
        b = reports[i]
        if b >= lb:
            break
        if b * (1 + GAP) < min(lb, est) and int(l_.max()) <= profs[i].max_len:
            b = max(b, pool_bound(l_, profs[i].pipes, b, min(lb, est), pool_s, iters, counts=True, compact=False)
                    if bound is None else bound(l_, profs[i].pipes, b, min(lb, est), pool_s))
            reports[i] = b
        lb = min(lb, b)
    return reports, max(lb, lp_sel.plan.lower_bound)


def rounded(l_: np.ndarray, prof, sol, rounds: int = 0) -> float:
    """The packed step time of pool_solve's solution rounded to a whole-document dispatch (module doc), after
    `rounds` rounds of the dispatch's local search (dispatch.owner_result) from it."""
    pipes, order = prof.pipes, sol["order"]
    groups: list[list[int]] = [[] for _ in pipes]
    for j, docs in sol["slots"]:
        groups[j] += [int(order[i]) for i in docs]
    pooled: dict[int, list[int]] = {}
    for pos, counts in sol["fluid"]:
        keys = list(counts)
        want = np.array([counts[k] for k in keys])
        want = want * (pos.size / want.sum())
        take = np.floor(want).astype(int)
        for r in np.argsort(-(want - take))[:pos.size - int(take.sum())]:
            take[r] += 1
        docs = [int(order[i]) for i in pos]
        for key, t in zip(keys, take):
            part, docs = docs[:t], docs[t:]
            if isinstance(key, tuple):
                pooled.setdefault(key[1], []).extend(part)
            else:
                groups[key] += part
    for ki, docs in pooled.items():
        js = sol["pools"][ki]
        p = pipes[js[0]]
        load = {j: float(p.work(l_[groups[j]]).sum()) if groups[j] else 0.0 for j in js}
        for d in sorted(docs, key=lambda d: -l_[d]):
            j = min(js, key=lambda j: load[j])
            groups[j].append(d)
            load[j] += p.w1(float(l_[d]))
    if rounds > 0:
        owner = np.empty(l_.size, dtype=np.int64)
        for j, g in enumerate(groups):
            owner[g] = j
        groups = [list(g) for g in owner_result(l_, pipes, owner, rounds).groups]
    return max((pack(l_[g], p.coeffs, p.pp, p.max_len).est_time for g, p in zip(groups, pipes) if g), default=0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-7b", "a800x256", "github", "10", "0:3")
    ap.add_argument("--pool-s", type=float, default=10.0, help="seconds per HiGHS solve of the pooled MILP")
    ap.add_argument("--round", action="store_true", help="also round feasible relaxations to plans (module doc)")
    ap.add_argument("--variants", default="plain",
                    help="pooled proofs to run, comma-separated: plain (decision 118), counts (--pool-counts, 123), "
                         "rows (count rows, modes' encoding; module doc)")
    ap.add_argument("--rows-iters", type=int, default=4,
                    help="bisection steps of the rows variant (prove_selection: 4)")
    args = ap.parse_args(argv)
    if not args.rows_iters >= 1:
        raise SystemExit(f"error: --rows-iters must be >= 1, got {args.rows_iters}")
    if not args.pool_s > 0:
        raise SystemExit(f"error: --pool-s must be > 0, got {args.pool_s}")
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        raise SystemExit(f"error: --variants must name some of {', '.join(VARIANTS)}, got {args.variants!r}")
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds, args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source} seeds {args.seeds}: candidates "
          f"{', '.join(names)}; pooled MILP {args.pool_s:g} s per solve")
    cols = "".join(f" {v} bound s | plan / {v} bound | {v} proof cpu s |" for v in variants)
    cols += " plan / best bound |" if len(variants) > 1 else ""
    print(f"| seed | step | docs | plan s | LP bound s | plan / LP bound | LP proof cpu s |{cols} rounded / plan |")
    print("|---" * (8 + 3 * len(variants) + (len(variants) > 1)) + "|")
    before, best = [], []
    after: dict[str, list[float]] = {v: [] for v in [*variants, "best"]}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for seed, k, l_ in steps:
        sel = select_step(l_, profs, seed=0)
        c0 = time.thread_time()
        lp_sel = prove_selection(l_, profs, sel)
        lp = lp_sel.plan
        c1 = time.thread_time()
        est = sel.plan.est_step_time
        before.append(est / lp.lower_bound)
        row, cand = "", [r.lower_bound for r in lp_sel.strategies]
        for v in variants:
            c2 = time.thread_time()
            if v in ("rows", "min", "rowsmin"):
                bs, step_lb = prove_rows(l_, profs, lp_sel, args.pool_s, args.rows_iters,
                                         {"min": _min_both, "rowsmin": _rows_finish}.get(v))
            else:
                got = prove_selection(l_, profs, sel, pool_s=args.pool_s, pool_counts=v == "counts")
                bs, step_lb = [r.lower_bound for r in got.strategies], got.plan.lower_bound
            cpu[v].append(time.thread_time() - c2)
            after[v].append(est / step_lb)
            cand = [max(a, b) for a, b in zip(cand, bs)]
            row += f" {step_lb:.4f} | {after[v][-1]:.4f} | {cpu[v][-1]:.1f} |"
        after["best"].append(est / max(min(cand), lp.lower_bound))
        row += f" {after['best'][-1]:.4f} |" if len(variants) > 1 else ""
        r = np.inf
        if args.round:
            for rep, prof in zip(sel.strategies, profs):
                if rep.lower_bound < est and int(l_.max()) <= prof.max_len:
                    for T in (est / 1.001, est / after["best"][-1] * 1.01):
                        st, sol = pool_solve(l_, prof.pipes, T, args.pool_s)
                        if sol is not None:
                            r = min(r, rounded(l_, prof, sol) / est)
            best.append(r)
        print(f"| {seed} | {k} | {l_.size} | {est:.4f} | {lp.lower_bound:.4f} | {before[-1]:.4f} | {c1 - c0:.2f} |"
              f"{row} {r:.4f} |", flush=True)
    b = np.array(before)
    for v in variants + (["best"] if len(variants) > 1 else []):
        a = np.array(after[v])
        print(f"{v}: steps {b.size}: plan / bound median {np.median(b):.4f} -> {np.median(a):.4f}, max {b.max():.4f} "
              f"-> {a.max():.4f}; <= 1.01: {int((b <= 1.01).sum())} -> {int((a <= 1.01).sum())}; within 0.2 % of the "
              f"plan after: {int((a <= 1.002).sum())}" + (f"; pooled proof cpu s median {np.median(cpu[v]):.1f} max "
                                                          f"{max(cpu[v]):.1f}" if v in cpu else ""))
    if best:
        print(f"rounded plans faster than the plan: {sum(x < 1 for x in best)} (best {min(best):.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
