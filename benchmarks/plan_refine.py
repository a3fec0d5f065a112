"""`tidal plan` with and without the proposal's refine search (`[planner] refine`, decision 101).

    python benchmarks/plan_refine.py [--seeds 2,3,4,5] [--clusters a800x8,a800x16] [--steps 20]

For each (cluster, seed): llama2-7b, synthetic commoncrawl, max_len 16384, 100,000 tokens per step, `--steps` steps
planned by `tidal plan` (charged, as by default) with refine and with `--no-refine`. Prints per cell the planned
(estimated) time of all steps and `tidal plan`'s wall and CPU time (proposal and planning; the first run of the
process includes numba's compilation), then refine / plain over the cells: median, p90 and worst. The estimates are
the planner's (decision 99 found them within ~1 % of the simulation); the times are one process's and noisy on a
loaded machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="2,3,4,5")
    ap.add_argument("--clusters", default="a800x8,a800x16")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    from tidal.cli.main import main as tidal
    from tidal.core.plan import Plan

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for cluster in args.clusters.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                total = {}
                for refine in (True, False):
                    out = Path(tmp) / f"{cluster}-{seed}-{refine}.json"
                    t, c = time.perf_counter(), time.process_time()
                    quiet = io.StringIO()  # tidal plan's summary table
                    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                        rc = tidal(["plan", "--model", "llama2-7b", "--cluster", cluster, "--max-len", "16384",
                                    "--tokens-per-step", "100000", "--steps", str(args.steps), "--seed", str(seed),
                                    "--quiet", "--json", str(out), *([] if refine else ["--no-refine"])])
                    assert rc == 0, quiet.getvalue()
                    wall, cpu = time.perf_counter() - t, time.process_time() - c
                    plan = Plan.load(out)
                    total[refine] = sum(s.est_step_time for s in plan.steps)
                    print(f"{cluster} seed {seed} {'refine' if refine else 'plain '}: planned {total[refine]:.3f} s "
                          f"over {len(plan.steps)} steps, {len(plan.candidates)} candidates; tidal plan {wall:.1f} s "
                          f"wall, {cpu:.1f} s CPU", flush=True)
                ratios.append(total[True] / total[False])
    r = np.array(ratios)
    print(f"refine / plain planned time over {len(r)} cells: median {np.median(r):.4f}, p90 "
          f"{np.percentile(r, 90):.4f}, worst {r.max():.4f}, best {r.min():.4f}")


if __name__ == "__main__":
    main()
