"""A table shaped like Hydraulis Fig. 13: simulated throughput of every system, speedup over the best static baseline.

Grid (Hydraulis §8.1-8.2, App. G): A800 nodes of 8 GPUs (400 GB/s NVLink, 200 GB/s IB); llama2-7b on 8 and 16 GPUs,
llama2-13b on 32, llama-32b on 64 (the paper's Table 3 with the exact GPU count of every scenario is not in our copy;
the text names "GitHub 7B 8GPUs" and "CommonCrawl 32B 64GPUs"); synthetic commoncrawl and github; 32K context with
100K (F2) and 200K (F3) tokens per step. Best static = the faster of megatron and deepspeed. Per cell: mean step
time of every system over --steps steps; then median, p90 and worst over the grid of tidal / best static and tidal /
hydraulis, and the share of long-document tokens (>= 8K) per cell, where tidal's CP-inside-heterogeneous should pay.

Usage: python benchmarks/simulate_fig13.py [--steps 20] [--jobs 2] [--quick] [--ideal-cp] [--cost-model SPEC]
                                          [--truth SPEC]
  --cost-model, --truth: what `tidal simulate` takes ('analytic', 'analytic-v1', a fitted JSON, a Hydraulis pool),
  or 'pool': the cell model's Hydraulis strategy pool (POOLS; a cell whose model has none keeps the analytic model
  and is marked '*').
"""

from __future__ import annotations

import argparse
import itertools
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from _simcommon import summary, workload

from tidal.simulator.engine import SimConfig
from tidal.simulator.systems import run_system, speedups

SCENARIOS = (("llama2-7b", "a800x8"), ("llama2-7b", "a800x16"), ("llama2-13b", "a800x32"), ("llama-32b", "a800x64"))
DATA = ("synthetic:commoncrawl", "synthetic:github")
TOKENS = (("F2", 100_000), ("F3", 200_000))
POOL_DIR = Path("/work/shared/data/hydraulis-profiles")
POOLS = {"llama2-7b": "7b", "llama2-13b": "13b", "hydraulis-32b": "32b"}  # model -> its Hydraulis strategy pool
SYSTEMS = ("megatron", "deepspeed", "hotspa", "wlb", "hydraulis", "tidal")  # Hydraulis' baselines, WLB-LLM, Tidal


def _spec(spec: str | None, model: str) -> str | None:
    """'pool' -> the model's pool file (None where it has none); anything else as given."""
    if spec != "pool":
        return spec
    return str(POOL_DIR / f"strategy_pool_{POOLS[model]}.json") if model in POOLS else None


def cell(args):
    (model, cluster), data, (fname, tokens), steps, ideal_cp, cost_model, truth = args
    cm, tr = _spec(cost_model, model), _spec(truth, model)
    w = workload(model, cluster, data, 32768, tokens, steps, cost_model=cm, truth=tr)
    t0 = time.perf_counter()
    runs = [run_system(s, w, SimConfig(cp_imbalance=not ideal_cp)) for s in SYSTEMS]
    sp = speedups(runs)
    lens = np.concatenate([np.asarray(w.source_factory().next_step().lengths) for _ in range(3)])
    long_share = float(lens[lens >= 8192].sum() / lens.sum())
    unmatched = (cost_model == "pool" and cm is None) or (truth == "pool" and tr is None)
    return dict(model=model + ("*" if unmatched else ""), cluster=cluster, data=data.split(":")[1], f=fname, sp=sp,
                long=long_share,
                times={r.name: r.mean_step_time for r in runs}, configs={r.name: r.config for r in runs},
                wall=time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="first scenario and dataset only")
    ap.add_argument("--ideal-cp", action="store_true",
                    help="simulate CP as a perfect 1/CP split of attention (what the planner's cost model assumes)")
    ap.add_argument("--cost-model", default=None, help="the planners' cost model (default analytic); 'pool': the "
                                                        "cell model's Hydraulis pool")
    ap.add_argument("--truth", default=None, help="the device model plans execute on (default: the planners'); "
                                                  "'pool': the cell model's Hydraulis pool")
    a = ap.parse_args()
    scen = SCENARIOS[:1] if a.quick else SCENARIOS
    data = DATA[:1] if a.quick else DATA
    grid = [(s, d, t, a.steps, a.ideal_cp, a.cost_model, a.truth) for s, d, t in itertools.product(scen, data, TOKENS)]
    with ProcessPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(cell, grid))
    names = list(SYSTEMS)
    print(f"Simulated speedup over the best static baseline (tokens/s), {a.steps} steps per cell"
          f"{', CP as a perfect split' if a.ideal_cp else ''}; planned with {a.cost_model or 'analytic'}, executed on "
          f"{a.truth or 'the same model'}")
    print(f"{'model':<11}{'GPUs':>5} {'data':<12}{'F':<3}{'long':>6} " + "".join(f"{n:>10}" for n in names)
          + f"{'static s':>10}{'tidal s':>9}")
    for c in cells:
        best = min(c["times"]["megatron"], c["times"]["deepspeed"])
        print(f"{c['model']:<11}{c['cluster'][5:]:>5} {c['data']:<12}{c['f']:<3}{c['long']:>6.2f} "
              + "".join(f"{c['sp'][n]:>10.2f}" for n in names) + f"{best:>10.3f}{c['times']['tidal']:>9.3f}")
    vs_static = [c["sp"]["tidal"] for c in cells]
    vs_hyd = [c["sp"]["tidal"] / c["sp"]["hydraulis"] for c in cells]
    print(f"\ntidal / best static: {summary(vs_static)}")
    print(f"tidal / hydraulis:   {summary(vs_hyd)}")
    top = max(c["long"] for c in cells)
    longs = [r for c, r in zip(cells, vs_hyd) if c["long"] >= 0.5 or c["long"] == top]
    print(f"tidal / hydraulis where long documents (>= 8K) hold the most tokens ({top:.2f}, or >= half): "
          f"{summary(longs)}")
    print(f"hydraulis / best static: {summary([c['sp']['hydraulis'] for c in cells])}")
    print("\nconfigs of the last cell:")
    for n, cf in cells[-1]["configs"].items():
        print(f"  {n}: {cf}")


if __name__ == "__main__":
    main()
