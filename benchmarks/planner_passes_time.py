"""CPU time per step of two sets of the planner's improvement passes, measured interleaved (decision 95).

Every step of every cell is planned with set A and with set B in turn (A first on even steps, B first on odd ones),
in one process, so both see the same machine load; prints per cell the median and p90 of each set's CPU ms per step
(time.thread_time) and est/bound median, then the totals. Cells: hand candidates, as planner_grid.py.

    python benchmarks/planner_passes_time.py --a all --b none [--models ..] [--clusters ..] [--sources ..]
        [--seeds 10,11,12] [--steps 5]

A set is 'all', 'none' or pass names (config.PASS_ORDER) joined by ','.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from planner_grid import MAX_LEN, TOKENS, Grid, q

from tidal.core import get_cluster
from tidal.data import sample_steps
from tidal.planner.config import PASS_ORDER, PlannerConfig
from tidal.planner.select import select_step


def config(spec: str) -> PlannerConfig:
    return PlannerConfig(passes=PASS_ORDER if spec == "all" else () if spec == "none" else tuple(spec.split(",")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", default="all")
    ap.add_argument("--b", default="none")
    ap.add_argument("--models", default="llama2-7b,llama2-13b,llama-32b")
    ap.add_argument("--clusters", default="a800x16,a800x64,a800x256")
    ap.add_argument("--sources", default="commoncrawl,github,flanv2,heavytail,stdlib")
    ap.add_argument("--seeds", default="10,11,12")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    cfgs = (config(args.a), config(args.b))
    print(f"A = {cfgs[0].passes}, B = {cfgs[1].passes}; seeds {args.seeds}, {args.steps} steps each; CPU ms per step")
    print("| model | cluster | source | A cpu med | A cpu p90 | B cpu med | B cpu p90 | A est/lb med | B est/lb med |")
    print("|---|---|---|---|---|---|---|---|---|")
    tot = [[], []]
    with tempfile.TemporaryDirectory() as tmp:
        grid = Grid(Path(tmp))
        for model in args.models.split(","):
            for cluster in args.clusters.split(","):
                for source in args.sources.split(","):
                    _, profs, _ = grid.candidates(model, cluster, "hand", source)
                    cpu, ratio = [[], []], [[], []]
                    n = 0
                    for seed in (int(x) for x in args.seeds.split(",")):
                        for st in sample_steps(grid.specs[source], seed=seed, max_len=MAX_LEN, steps=args.steps,
                                               tokens_per_step=TOKENS[get_cluster(cluster).num_devices])[0]:
                            l_ = st.lengths_array()
                            if int(l_.max()) > max(p.max_len for p in profs):
                                continue  # no candidate holds its longest document (the grid counts it failed)
                            for k in ((0, 1) if n % 2 == 0 else (1, 0)):
                                c0 = time.thread_time()
                                plan = select_step(l_, profs, seed=0, config=cfgs[k]).plan
                                cpu[k].append((time.thread_time() - c0) * 1e3)
                                ratio[k].append(plan.est_step_time / plan.lower_bound if plan.lower_bound else 1.0)
                            n += 1
                    tot[0] += cpu[0]
                    tot[1] += cpu[1]
                    print(f"| {model} | {cluster} | {source} | {q(cpu[0], .5):.1f} | {q(cpu[0], .9):.1f} | "
                          f"{q(cpu[1], .5):.1f} | {q(cpu[1], .9):.1f} | {q(ratio[0], .5):.4f} | "
                          f"{q(ratio[1], .5):.4f} |", flush=True)
    print(f"\nall steps: A cpu ms mean {np.mean(tot[0]):.2f} median {q(tot[0], .5):.2f} p90 {q(tot[0], .9):.2f}; "
          f"B mean {np.mean(tot[1]):.2f} median {q(tot[1], .5):.2f} p90 {q(tot[1], .9):.2f}; "
          f"B / A total {sum(tot[1]) / sum(tot[0]):.3f}")


if __name__ == "__main__":
    main()
