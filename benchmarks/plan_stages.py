"""Where a step's plan time goes: select_step's CPU time per step, and the part of it spent in the bounds and in
Hydraulis' dispatch, on the grid's held-out steps (issue 27's plan-time profile; decisions 121, 124).

    PYTHONPATH=<tree>/src OMP_NUM_THREADS=1 python benchmarks/plan_stages.py
        [--cells llama-32b:a800x16:flanv2,llama2-13b:a800x16:flanv2] [--seeds 10,11,12] [--steps 5]

For each cell (model:cluster:source, hand candidates from planner_grid.py) it plans every step once unmeasured
(the first) and then each in turn after a full garbage collection, and prints the step's CPU ms (thread_time; median,
p90, mean) and, per step on average, the CPU ms inside `StrategyBound(...)` (the quick bounds), `.refined()` and
`dispatch_hydraulis` (the mode search left the planner with decision 154). The stages are
timed by wrapping those functions in this process only (a measurement, not a configuration). Run it with each source
tree on its PYTHONPATH to compare two trees (this script and planner_grid.py are the same in both); timings on a
shared machine are noisy, so run the trees in turn, twice.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="llama-32b:a800x16:flanv2,llama2-13b:a800x16:flanv2,"
                    "llama2-13b:a800x16:heavytail")
    ap.add_argument("--seeds", default="10,11,12")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    cells = [c.split(":") for c in args.cells.split(",")]
    if any(len(c) != 3 for c in cells) or args.steps < 1:
        raise SystemExit("plan_stages: --cells takes model:cluster:source[,...] and --steps must be >= 1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from planner_grid import MAX_LEN, TOKENS, Grid, warm_kernels

    from tidal.core import get_cluster
    from tidal.data import sample_steps
    from tidal.planner import bounds, select

    spent: dict[str, float] = {}

    def timed(name, f):
        def g(*a, **k):
            c0 = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - c0
        return g

    bounds.StrategyBound.__init__ = timed("StrategyBound", bounds.StrategyBound.__init__)
    bounds.StrategyBound.refined = timed("refined", bounds.StrategyBound.refined)
    select.dispatch_hydraulis = timed("Hydraulis dispatch", select.dispatch_hydraulis)
    tmp = tempfile.TemporaryDirectory()
    grid = Grid(Path(tmp.name))
    warm_kernels()
    print("| cell | steps | step CPU ms median / p90 / mean | per step: StrategyBound / refined / Hydraulis dispatch "
          "(ms) |\n|---|---|---|---|")
    for model, cluster, source in cells:
        _, profs, _ = grid.candidates(model, cluster, "hand", source)
        tokens = TOKENS[get_cluster(cluster).num_devices]
        steps = [s.lengths_array() for seed in map(int, args.seeds.split(",")) for s in
                 sample_steps(grid.specs[source], seed=seed, tokens_per_step=tokens, max_len=MAX_LEN,
                              steps=args.steps)[0]]
        select.select_step(steps[0], profs, seed=0)
        spent.clear()
        cpu = []
        for ls in steps:
            gc.collect()
            c0 = time.thread_time()
            select.select_step(ls, profs, seed=0)
            cpu.append((time.thread_time() - c0) * 1e3)
        parts = " / ".join(f"{spent.get(k, 0.0) * 1e3 / len(steps):.2f}"
                           for k in ("StrategyBound", "refined", "Hydraulis dispatch"))
        print(f"| {model} {cluster} {source} | {len(steps)} | {np.median(cpu):.1f} / {np.percentile(cpu, 90):.1f} / "
              f"{np.mean(cpu):.1f} | {parts} |", flush=True)


if __name__ == "__main__":
    main()
