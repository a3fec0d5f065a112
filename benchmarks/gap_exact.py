"""Is a step's gap to its bound in the plan or in the bound? Settled by an exact MILP (issue 27, decision 108).

For each step of one grid cell (benchmarks/planner_grid.py: same candidates, tokens per step and sources): the plan of
`select_step`, its bounds after `proof.lp.prove_selection` (what `planner.py --grid --prove` reports), and for every
candidate whose bound is under the plan's estimate, `proof.milp.dispatch_feasible` (HiGHS MILP: is there a dispatch,
every document whole on one pipeline, with every pipeline's `pipeline_bound` <= T?) by bisection on T between that bound
and the plan's estimate. "infeasible" at T proves that no plan of that candidate is faster than T (up to HiGHS'
tolerances); a feasible dispatch is packed (`packing.pack`) and compared with the plan: faster means plan-side gap.

Prints per step: documents, plan estimate, step bound (prove_selection), the MILP-proven step bound (the least over
the candidates of max(bound, MILP bound)), both ratios, and the best packed MILP dispatch. Then their medians.

    python benchmarks/gap_exact.py --model llama2-7b --cluster a800x64 --source stdlib --seeds 10,11,12 --steps 0:5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps

from tidal.planner.packing import pack
from tidal.planner.select import select_step
from tidal.proof.lp import prove_selection
from tidal.proof.milp import dispatch_feasible


def packed_est(l_: np.ndarray, prof, groups) -> float:
    est = 0.0
    for g, p in zip(groups, prof.pipes):
        if g:
            est = max(est, pack(l_[list(g)], p.coeffs, p.pp, p.max_len).est_time)
    return est


def milp_bound(l_, prof, lo: float, hi: float, iters: int, limit: float) -> tuple[float, float, str]:
    """(proven bound, best packed estimate of a feasible MILP dispatch (inf if none), status at hi / (1 + 1e-3))."""
    T = hi / (1 + 1e-3)
    st, groups = dispatch_feasible(l_, prof.pipes, T, limit)
    best = packed_est(l_, prof, groups) if groups else np.inf
    first = st
    if st == "infeasible":
        return T, best, first
    a, b = lo, T  # a proven, b not
    for _ in range(iters):
        m = 0.5 * (a + b)
        st, groups = dispatch_feasible(l_, prof.pipes, m, limit)
        if st == "infeasible":
            a = m
        else:
            b = m
            if groups:
                best = min(best, packed_est(l_, prof, groups))
    return a, best, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-7b", "a800x64", "stdlib", "10,11,12", "0:5")
    ap.add_argument("--iters", type=int, default=6, help="MILP bisection steps after the first MILP")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per MILP")
    args = ap.parse_args(argv)
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}")
    print("| seed | step | docs | plan s | bound s | plan / bound | MILP bound s | plan / MILP bound | first MILP "
          "| best MILP plan / plan | MILP s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    before, after, milp_plan = [], [], []
    for seed, k, l_ in steps:
        sel = prove_selection(l_, profs, select_step(l_, profs, seed=0))
        est, lb = sel.plan.est_step_time, sel.plan.lower_bound
        t0 = time.perf_counter()
        lbs, best, firsts = [], np.inf, []
        for rep, prof in zip(sel.strategies, profs):
            b0 = rep.lower_bound
            if not np.isfinite(b0) or b0 >= est * (1 - 1e-3):
                lbs.append(b0)
                continue
            mb, pe, first = milp_bound(l_, prof, b0, est, args.iters, args.time_limit)
            lbs.append(max(b0, mb))
            best = min(best, pe)
            firsts.append(first[:3])
        lb2 = max(lb, min(lbs))
        before.append(est / lb)
        after.append(est / lb2)
        milp_plan.append(best / est)
        print(f"| {seed} | {k} | {l_.size} | {est:.4f} | {lb:.4f} | {est / lb:.4f} | {lb2:.4f} | {est / lb2:.4f} "
              f"| {'/'.join(firsts)} | {best / est:.4f} | {time.perf_counter() - t0:.1f} |", flush=True)
    print(f"steps {len(before)}: plan / bound median {np.median(before):.4f} -> with the MILP bound "
          f"{np.median(after):.4f} (max {max(before):.4f} -> {max(after):.4f}); best MILP plan / plan min "
          f"{min(milp_plan):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
