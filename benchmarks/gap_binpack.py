"""Is a step's gap micro-batch integrality, on the plan's side or on the bound's? (issue 27, decision 123)

For each step of one grid cell (planner_grid.probe_steps): the plan of `select_step`, its proven bound
(`proof.lp.prove_selection`), and for each pipeline of the chosen candidate: documents, tokens, the packer's micro-batch
count V, ceil(tokens / MaxLen), the bin-packing L2 count (Martello-Toth) and the least count an exact bin-packing
MILP finds (HiGHS; `proof.binpack.min_bins`), its packed time and its `pipeline_bound`. One-stage pipelines (time
V c + W): the packing is optimal for its documents exactly when V is the least count.

    python benchmarks/gap_binpack.py --model llama2-13b --cluster a800x16 --source commoncrawl --seeds 0 --steps 0:5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps

from tidal.planner.bounds import pipeline_bound
from tidal.planner.select import select_step
from tidal.proof.binpack import l2_bins, min_bins
from tidal.proof.lp import prove_selection


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-13b", "a800x16", "commoncrawl", "0", "0:5")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per bin-packing MILP")
    ap.add_argument("--all", action="store_true", help="every pipeline, not only those over their pipeline_bound")
    args = ap.parse_args(argv)
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}")
    print("| seed | step | docs | est / bound | chosen | pipe | scheme | docs | tokens | MaxLen | V | ceil | L2 | "
          "min V | est s | est / pipe bound | MILP s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    n_pipes = n_opt = 0
    for seed, k, l_ in steps:
        sel = prove_selection(l_, profs, select_step(l_, profs, seed=0))
        plan = sel.plan
        prof = profs[plan.strategy]
        lens = np.asarray(plan.seq_lengths, dtype=np.int64)
        for j, (pp_, pc) in enumerate(zip(plan.pipelines, prof.pipes)):
            docs = [i for mb in pp_.micro_batches for i in mb]
            if not docs:
                continue
            ll = lens[docs]
            pb = pipeline_bound(ll, pc)
            if not args.all and pp_.est_time <= pb * (1 + 1e-4):
                continue
            V = len(pp_.micro_batches)
            t0 = time.perf_counter()
            mv, st = min_bins(ll, pc.max_len, args.time_limit, upper=V)
            dt = time.perf_counter() - t0
            n_pipes += 1
            n_opt += int(st == "optimal" and mv == V)
            print(f"| {seed} | {k} | {l_.size} | {plan.est_step_time / plan.lower_bound:.4f} | {names[plan.strategy]} "
                  f"| {j} | {sel.pipelines[j].scheme} | {ll.size} | {int(ll.sum())} | {pc.max_len} | {V} "
                  f"| {-(-int(ll.sum()) // pc.max_len)} | {l2_bins(ll, pc.max_len)} | {mv} ({st}) "
                  f"| {pp_.est_time:.4f} | {pp_.est_time / pb:.4f} | {dt:.1f} |", flush=True)
    print(f"pipelines examined {n_pipes}: packer's V proven least on {n_opt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
