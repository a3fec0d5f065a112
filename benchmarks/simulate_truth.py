"""Planning apart from truth (decision 77): Tidal planned with the analytic model vs planned on the profiled truth.

Every cell executes on the truth: Hydraulis' published strategy pool of the cell's model (`tidal simulate --truth
POOL.json`). The reference systems plan on it too (the best static = faster of megatron and deepspeed, and
hydraulis, which plans with its own profiled pool as in its paper). Tidal plans with, in turn:
  truth     the pool itself (what the simulator executes: no planning error),
  analytic  the calibrated analytic model (decision 76),
  v1        the analytic model before decision 76 (issue 24: "1.52x -> 1.28x over the best static").
Printed per cell: tokens/s of each over the best static's, and median, p90 and worst over the grid.

Grid (the cells of simulate_fig13.py whose model has a published pool): llama2-7b on a800x8 and a800x16, llama2-13b
on a800x32; synthetic commoncrawl and github; 32K context; 100K (F2) and 200K (F3) tokens per step.

Usage: python benchmarks/simulate_truth.py [--steps 10] [--jobs 1] [--quick] [--pools DIR] [--seed 0] [--ablate]
(--ablate: also `tidal-nocharge`, Tidal's planner without decision 86's pull/push and CP-imbalance charges)
"""

from __future__ import annotations

import argparse
import itertools
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _simcommon import summary, workload

from tidal.simulator.systems import run_system

SCENARIOS = (("llama2-7b", "a800x8", "7b"), ("llama2-7b", "a800x16", "7b"), ("llama2-13b", "a800x32", "13b"))
DATA = ("synthetic:commoncrawl", "synthetic:github")
TOKENS = (("F2", 100_000), ("F3", 200_000))
PLANNING = ("truth", "analytic", "analytic-v1")


def cell(args):
    (model, cluster, pool_name), data, (fname, tokens), steps, pools, seed, ablate = args
    pool = str(pools / f"strategy_pool_{pool_name}.json")
    t0 = time.perf_counter()
    on_truth = workload(model, cluster, data, 32768, tokens, steps, seed, cost_model=pool, truth=pool)
    ref = {s: run_system(s, on_truth) for s in ("megatron", "deepspeed", "hydraulis")}
    tps = {s: r.tokens_per_s for s, r in ref.items()}
    configs = {s: r.config for s, r in ref.items()}
    for plan in PLANNING:
        w = on_truth if plan == "truth" else workload(model, cluster, data, 32768, tokens, steps, seed,
                                                      cost_model=plan, truth=pool)
        for name in ("tidal", "tidal-nocharge") if ablate else ("tidal",):
            r = run_system(name, w)
            tps[f"{name}/{plan}"] = r.tokens_per_s
            configs[f"{name}/{plan}"] = r.config
    best = max(tps["megatron"], tps["deepspeed"])
    return dict(model=model, cluster=cluster, data=data.split(":")[1], f=fname,
                sp={k: v / best for k, v in tps.items()}, configs=configs, wall=time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="first scenario and dataset only")
    ap.add_argument("--pools", type=Path, default=Path("/work/shared/data/hydraulis-profiles"))
    ap.add_argument("--seed", type=int, default=0, help="data seed (0 was used while developing; 1, 2 held out)")
    ap.add_argument("--ablate", action="store_true",
                    help="also tidal-nocharge: Tidal's planner without decision 86's sync/CP charges")
    a = ap.parse_args()
    scen = SCENARIOS[:1] if a.quick else SCENARIOS
    data = DATA[:1] if a.quick else DATA
    grid = [(s, d, t, a.steps, a.pools, a.seed, a.ablate) for s, d, t in itertools.product(scen, data, TOKENS)]
    with ProcessPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(cell, grid))
    names = ("tidal", "tidal-nocharge") if a.ablate else ("tidal",)
    cols = ["megatron", "deepspeed", "hydraulis"] + [f"{n}/{p}" for n in names for p in PLANNING]
    print(f"Executed on Hydraulis' profiled pool (truth); tokens/s over the best static planned on it; "
          f"{a.steps} steps; seed {a.seed}")
    print(f"{'model':<11}{'GPUs':>5} {'data':<12}{'F':<3}" + "".join(f"{c:>27}" for c in cols) + f"{'wall s':>8}")
    for c in cells:
        print(f"{c['model']:<11}{c['cluster'][5:]:>5} {c['data']:<12}{c['f']:<3}"
              + "".join(f"{c['sp'][k]:>27.3f}" for k in cols) + f"{c['wall']:>8.0f}")
    for k in cols[2:]:
        print(f"{k + ' / best static:':<44}{summary([c['sp'][k] for c in cells])}")
    for n in names:
        for p in PLANNING:
            vs = [c["sp"][f"{n}/{p}"] / c["sp"]["hydraulis"] for c in cells]
            print(f"{n + '/' + p + ' / hydraulis:':<44}{summary(vs)}")
    print(f"{'tidal/analytic / tidal/truth:':<44}"
          f"{summary([c['sp']['tidal/analytic'] / c['sp']['tidal/truth'] for c in cells])}")
    print("\nconfigs of the last cell:")
    for n, cf in cells[-1]["configs"].items():
        print(f"  {n}: {cf}")


if __name__ == "__main__":
    main()
