"""FlexPipe (HBSA, flexpipe.txt §5 Alg. 1) vs the best static PP, simulated on FlexPipe's evaluation set-up.

Set-up (flexpipe.txt §7.1, Table 1): nodes of 4 A100-80GB (NVLink 300 GB/s, IB 50 GB/s); BERT-24 (340M) on 1 node,
BERT-96 (1.36B) on 2, GPT 3.35B on 4, GPT 13B on 8 (§7.2.1); FLANv2-like lengths (synthetic:flanv2); maximum
sequence length 2048, 4096 and 8192; a global batch of 4 context windows of tokens per step. (BERT is costed as a
causal decoder by Tidal's cost model, an approximation.) Systems:
  static-pp  the mapping HBSA picks for the context length (even split, TP = 1, data parallel inside stages), held
  flexpipe   HBSA every step: keep / recompute / grow / shrink, reconfiguration (layer migration) costs charged
  megatron   the best static <TP,PP,CP> x DP (reference)
Reported per cell: tokens/s ratio flexpipe / static-pp and megatron / static-pp, reconfigurations per 100 steps, the
decisions taken, HBSA time per decision (median, p90) against the paper's 15 ms; then median / p90 / worst over cells.

Usage: python benchmarks/simulate_flexpipe.py [--steps 100] [--jobs 2]
"""

from __future__ import annotations

import argparse
import itertools
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _simcommon import summary

from tidal.core.cluster import GB, ClusterSpec, DeviceType, NodeGroup
from tidal.core.model import ModelSpec
from tidal.costmodel import AnalyticCostModel
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator.engine import SimConfig
from tidal.simulator.flexpipe import run_flexpipe
from tidal.simulator.systems import Workload, run_system

A100 = DeviceType("a100", 312e12, 80 * GB, 300 * GB, 50 * GB, per_node=4)
MODELS = (
    (ModelSpec("bert-24", 24, 1024, 16, 16, 4096, 30522), 1),
    (ModelSpec("bert-96", 96, 1024, 16, 16, 4096, 30522), 2),
    (ModelSpec("gpt-3.35b", 16, 4096, 32, 32, 16384, 50257), 4),
    (ModelSpec("gpt-13b", 40, 5120, 40, 40, 20480, 50257), 8),
)
LENGTHS = (2048, 4096, 8192)
DATA = "synthetic:flanv2"


def cell(args):
    (model, nodes), max_len, steps = args
    cl = ClusterSpec(f"a100x{4 * nodes}(4/node)", (NodeGroup(A100, 4 * nodes),))
    cm = AnalyticCostModel(model, cl)
    tokens = 4 * max_len
    w = Workload(cm, max_len, tokens, steps, 0,
                 lambda: TokenBudgetSampler(length_source(DATA, 0), tokens, max_len, seed=0),
                 length_source(DATA, 0).lengths(0, 5000))
    sim = SimConfig()
    flex = run_flexpipe(w, sim, None)
    static = run_flexpipe(w, sim, None, static=True, name="static-pp")
    mega = run_system("megatron", w, sim)
    return dict(model=model.name, gpus=4 * nodes, max_len=max_len, flex=flex, static=static, mega=mega)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    with ProcessPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(cell, [(m, ml, a.steps) for m, ml in itertools.product(MODELS, LENGTHS)]))
    print(f"FlexPipe vs static PP, {DATA}, 4 context windows of tokens per step, {a.steps} steps")
    print(f"{'model':<10}{'GPUs':>5}{'max len':>8}{'flex/static':>12}{'mega/static':>12}{'reconf/100':>11}"
          f"{'HBSA ms med':>12}{'p90':>7}  decisions | static mapping")
    ratios, rec, ms = [], [], []
    for c in cells:
        f, s, m = c["flex"], c["static"], c["mega"]
        r = f.tokens_per_s / s.tokens_per_s
        ratios.append(r)
        rec.append(100 * f.switches / max(1, len(f.steps)))
        ms += f.decision_ms
        print(f"{c['model']:<10}{c['gpus']:>5}{c['max_len']:>8}{r:>12.3f}{m.tokens_per_s / s.tokens_per_s:>12.3f}"
              f"{rec[-1]:>11.1f}{np.median(f.decision_ms):>12.2f}{np.percentile(f.decision_ms, 90):>7.2f}  "
              f"{f.config.split(';')[0]} | {s.strategies[0]}")
    print(f"\nflexpipe / static PP (tokens/s): {summary(ratios)}")
    print(f"reconfigurations per 100 steps: {summary(rec)}")
    print(f"HBSA time per decision (ms): median {np.median(ms):.2f}, p90 {np.percentile(ms, 90):.2f}, "
          f"max {np.max(ms):.2f} (paper: 15 ms average)")


if __name__ == "__main__":
    main()
