"""A cheap repair of a packed plan: drop a micro-batch, repack, rebalance (issue 27, decision 131; since decision 134
the planner's `repair` pass, planner/repair.py, whose module doc states the steps; this script runs it on the plan
of `select_step` without that pass).

Works on the plan `select_step` returns (its passes less `repair`), for its chosen candidate, when every pipeline has
one stage priced as the sum of its micro-batches (time V c + W, decision 94; skipped otherwise). The repair's knobs
are PlannerConfig's repair_* (--excess, --drop-tries, --rounds, --drops, --moves, --partners). The result is checked
(every document once, every micro-batch <= MaxLen, no empty micro-batch) and timed as the planner times a one-stage
pipeline: the sum over its micro-batches of c + work (the plan's own time is recomputed so and must equal its
est_time). Printed: plan / bound, repaired / plan, repaired / bound, CPU ms of the repair.

    cd benchmarks && python gap_trim.py --model llama2-13b --cluster a800x16 --source flanv2 --seeds 0,1,2 --steps 0:5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps, q

from tidal.planner.config import PASS_ORDER, PlannerConfig
from tidal.planner.repair import Repair, repair
from tidal.planner.select import select_step
from tidal.proof.lp import prove_selection


def check(tr: Repair) -> float:
    """Every document once, every micro-batch non-empty and <= MaxLen (ValueError if not); the step time."""
    if not tr.valid():
        raise ValueError("the plan loses or repeats a document, or has an empty micro-batch or one over MaxLen")
    return float(tr.times().max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-13b", "a800x16", "flanv2", "0,1,2", "0:5")
    ap.add_argument("--excess", type=float, default=0.02, help="step 2 tries pipelines over (V - 1) MaxLen by at "
                                                               "most this fraction of MaxLen")
    ap.add_argument("--drop-tries", type=int, default=3, help="step 2: document counts tried per pipeline")
    ap.add_argument("--rounds", type=int, default=3, help="steps 2-3 repeated at most this often")
    ap.add_argument("--drops", type=int, default=1, help="step 2: single-pipeline drops tried per round")
    ap.add_argument("--moves", type=int, default=64, help="step 3: moves and swaps per rebalance")
    ap.add_argument("--partners", type=int, default=3, help="step 3: swap partners (least loaded pipelines)")
    ap.add_argument("--prove", choices=["none", "lp", "pool"], default="lp",
                    help="the bound: none, the LP proof, or the pooled proof with count rows (--pool-s s per solve)")
    ap.add_argument("--pool-s", type=float, default=5.0, help="seconds per pooled solve (--prove pool)")
    args = ap.parse_args(argv)
    if not (0 < args.excess <= 1 and args.drop_tries >= 1 and args.rounds >= 1 and args.pool_s > 0
            and min(args.drops, args.moves, args.partners) >= 0):
        raise SystemExit(f"error: --excess in (0, 1], --drop-tries and --rounds >= 1, --pool-s > 0, --drops, --moves "
                         f"and --partners >= 0; got {args.excess}, {args.drop_tries}, {args.rounds}, {args.pool_s}, "
                         f"{args.drops}, {args.moves}, {args.partners}")
    config = PlannerConfig(passes=tuple(p for p in PASS_ORDER if p != "repair"))
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}; bound "
          f"{args.prove}; excess {args.excess:g}, drop tries {args.drop_tries}, rounds {args.rounds}, drops "
          f"{args.drops}, moves {args.moves}, partners {args.partners}")
    print("| seed | step | docs | candidate | plan s | plan / bound | repaired / plan | repaired / bound | V before | "
          "V after | repacked | dropped | moves | repair CPU ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios, after, cpu = [], [], []
    for seed, k, l_ in steps:
        sel = select_step(l_, profs, seed=0, config=config)
        if args.prove != "none":
            sel = prove_selection(l_, profs, sel, pool_s=args.pool_s if args.prove == "pool" else 0.0,
                                  pool_counts=args.prove == "pool")
        plan, est = sel.plan, sel.plan.est_step_time
        lb = plan.lower_bound if args.prove != "none" else np.nan
        pipes = list(profs[plan.strategy].pipes)
        if any(p.pp != 1 or p.eq1 for p in pipes):
            print(f"| {seed} | {k} | {l_.size} | {names[plan.strategy]} | {est:.5f} | {est / lb:.4f} | (not one-stage: "
                  f"skipped) | | | | | | | |")
            continue
        bins = [[list(mb) for mb in pp.micro_batches] for pp in plan.pipelines]
        own = check(Repair(l_, pipes, bins))
        if abs(own - est) > 1e-9 * est:
            raise SystemExit(f"error: the plan's time {own} is not its est_time {est} (seed {seed} step {k})")
        c0 = time.thread_time()
        tr, repacked, dropped, moves = repair(l_, pipes, bins, excess=args.excess, tries=args.drop_tries,
                                              rounds=args.rounds, drops=args.drops, moves=args.moves,
                                              partners=args.partners)
        tr = tr or Repair(l_, pipes, bins)  # None: no pipeline repacks, the plan is kept
        got = check(tr)
        ms = (time.thread_time() - c0) * 1e3
        tr_v = [len([b for b in bs if b]) for bs in bins]
        ratios.append(got / est)
        after.append(got / lb)
        cpu.append(ms)
        print(f"| {seed} | {k} | {l_.size} | {names[plan.strategy]} | {est:.5f} | {est / lb:.4f} | {got / est:.4f} | "
              f"{got / lb:.4f} | {tr_v} | {[len(bs) for bs in tr.bins]} | {repacked} | {dropped} | {moves} | "
              f"{ms:.0f} |", flush=True)
    if ratios:
        print(f"# repaired / plan: median {q(ratios, 0.5):.4f}, p90 {q(ratios, 0.9):.4f}, worst {max(ratios):.4f}; "
              f"repaired / bound: median {q(after, 0.5):.4f}, p90 {q(after, 0.9):.4f}, worst {max(after):.4f}, "
              f"<= 1.01 on {sum(a <= 1.01 for a in after)} of {len(after)}; CPU ms median {q(cpu, 0.5):.0f}, "
              f"p90 {q(cpu, 0.9):.0f}, worst {max(cpu):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
