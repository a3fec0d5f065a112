"""Mixed cluster (Hetu v2 §7.1, App. A.2): 16 H800 + 32 H20, heterogeneous plans vs the best uniform ones, simulated.

Per model (llama2-7b, llama-32b), synthetic commoncrawl at 32K with 200K tokens per step:
  megatron        best static homogeneous <TP,PP,CP> x DP (FFD packing, even dispatch), as the baselines stay uniform
  uniform-tidal   every feasible homogeneous strategy as a candidate, Tidal's per-step selection, dispatch and packing
                  (the best uniform plan per step)
  hydraulis       heterogeneous <TP,PP>, CP = 1
  tidal           heterogeneous <TP,PP,CP>
Every scheme must fit the memory of every device type (80 GB H800, 96 GB H20); a pipeline runs at its slowest stage.
Reported: mean step time, tokens/s ratio to megatron and to uniform-tidal, and median / p90 / worst per-step ratio of
tidal to uniform-tidal (same steps).

Usage: python benchmarks/simulate_mixed.py [--steps 20] [--jobs 2]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _simcommon import summary, workload

from tidal.simulator import baselines
from tidal.simulator.engine import SimConfig
from tidal.simulator.systems import _options, run_planner, run_system

CLUSTER = "h800x16+h20x32"
MODELS = ("llama2-7b", "llama-32b")


def cell(args):
    model, steps = args
    w = workload(model, CLUSTER, "synthetic:commoncrawl", 32768, 200_000, steps)
    sim = SimConfig()
    runs = {n: run_system(n, w, sim) for n in ("megatron", "hydraulis", "tidal")}
    uni = [c.strategy for c in baselines.configs(w.cost_model, w.max_len)]
    runs["uniform-tidal"] = run_planner("uniform-tidal", w, sim, uni, _options(w), None,
                                        config=f"{len(uni)} homogeneous candidates")
    return model, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    with ProcessPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(cell, [(m, a.steps) for m in MODELS]))
    names = ("megatron", "uniform-tidal", "hydraulis", "tidal")
    print(f"{CLUSTER}, synthetic:commoncrawl, 32K context, 200K tokens/step, {a.steps} steps")
    for model, runs in cells:
        print(f"\n{model}")
        print(f"  {'system':<14}{'mean step s':>12}{'vs megatron':>13}{'vs uniform':>12}  config")
        for n in names:
            r = runs[n]
            print(f"  {n:<14}{r.mean_step_time:>12.3f}{r.tokens_per_s / runs['megatron'].tokens_per_s:>13.3f}"
                  f"{r.tokens_per_s / runs['uniform-tidal'].tokens_per_s:>12.3f}  {r.config[:90]}")
        ratio = np.asarray(runs["uniform-tidal"].step_times) / np.asarray(runs["tidal"].step_times)
        print(f"  per-step uniform-tidal / tidal: {summary(ratio)}")
        used = sorted(set(runs["uniform-tidal"].strategies))
        print(f"  uniform strategies used: {', '.join(used)}")


if __name__ == "__main__":
    main()
