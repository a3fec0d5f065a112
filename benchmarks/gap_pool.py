"""How far the pooled MILP (proof.pool, decision 118) raises the proven bound of large steps, and at what cost.

For each step of one grid cell (benchmarks/planner_grid.py: same candidates, tokens per step and sources): the plan of
`select_step`, the step bound after `proof.lp.prove_selection` (what `planner.py --grid --prove` reports), and after
`prove_selection(..., pool_s=S)` (the pooled MILP on every candidate still under the plan, S seconds per HiGHS solve),
with the proof's CPU time (thread_time) beside the LP proof's. "closed" counts the steps whose proven gap ends <= 1 %.
A bound that rises to the plan puts that step's gap in the bound; one that stays under it leaves the gap open (the
relaxation is feasible there, or a solve timed out: "unknown" proves nothing).

    cd benchmarks && python gap_pool.py --model llama2-7b --cluster a800x256 --source github --seeds 10 --steps 0:3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_steps

from tidal.planner.select import select_step
from tidal.proof.lp import prove_selection


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--cluster", default="a800x256")
    ap.add_argument("--candidates", choices=["proposal", "hand"], default="proposal")
    ap.add_argument("--source", default="github")
    ap.add_argument("--seeds", default="10")
    ap.add_argument("--steps", default="0:3", help="comma-separated step indices, or N:M for a range")
    ap.add_argument("--pool-s", type=float, default=10.0, help="seconds per HiGHS solve of the pooled MILP")
    args = ap.parse_args(argv)
    if not args.pool_s > 0:
        raise SystemExit(f"error: --pool-s must be > 0, got {args.pool_s}")
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds, args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source} seeds {args.seeds}: candidates "
          f"{', '.join(names)}; pooled MILP {args.pool_s:g} s per solve")
    print("| seed | step | docs | plan s | LP bound s | plan / LP bound | pooled bound s | plan / pooled bound "
          "| LP proof cpu s | pooled proof cpu s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    before, after, cpu = [], [], []
    for seed, k, l_ in steps:
        sel = select_step(l_, profs, seed=0)
        c0 = time.thread_time()
        lp = prove_selection(l_, profs, sel).plan
        c1 = time.thread_time()
        pool = prove_selection(l_, profs, sel, pool_s=args.pool_s).plan
        c2 = time.thread_time()
        est = sel.plan.est_step_time
        before.append(est / lp.lower_bound)
        after.append(est / pool.lower_bound)
        cpu.append(c2 - c1)
        print(f"| {seed} | {k} | {l_.size} | {est:.4f} | {lp.lower_bound:.4f} | {before[-1]:.4f} | "
              f"{pool.lower_bound:.4f} | {after[-1]:.4f} | {c1 - c0:.2f} | {c2 - c1:.1f} |", flush=True)
    b, a = np.array(before), np.array(after)
    print(f"steps {b.size}: plan / bound median {np.median(b):.4f} -> {np.median(a):.4f}, max {b.max():.4f} -> "
          f"{a.max():.4f}; <= 1.01: {int((b <= 1.01).sum())} -> {int((a <= 1.01).sum())}; within 0.2 % of the plan "
          f"after: {int((a <= 1.002).sum())}; pooled proof cpu s median {np.median(cpu):.1f} max {max(cpu):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
