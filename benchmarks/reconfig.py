"""FlexPipe in `tidal train` (decision 91): reconfiguration stall live against checkpoint-and-restart, bytes per
reconfiguration, and reconfigurations per 100 steps on a FLANv2-like corpus.

1. live: `tidal train` (tiny, 8 gloo ranks, fp32) with `[planner] name = "flexpipe"`, depths cycled 4,1 (PP 4 with
   an uneven 6-layer split, then 8 data-parallel pipelines): every step reconfigures. Per reconfiguration: the pull's
   wall time (the stall: the step's pull, which moves the layers), its excess over a static step's pull (depth 1 held),
   bytes received for the moved layers against their parameter bytes. FlexPipe reports 0.79 s.
2. checkpoint-and-restart of the same change (PP 4 -> 8 x PP 1): run A trains at depth 4 and saves a synchronous
   checkpoint at its last step; run B resumes it at depth 1. Stall = A's last row to A's exit (save, teardown) + B's
   launch to its first row less that step's own loop time (spawn, imports, groups, stage models, warm-up, load).
   FlexPipe reports 7.16 s.
3. FLANv2-like lengths (synthetic:flanv2): HBSA alone over 100 planned steps (GPT 3.35B, FlexPipe's Table 2 memory,
   A100s; tiny on cpux8), reconfigurations per 100 steps; then short real runs of tiny on 8 ranks with HBSA's own
   triggers against static PP 2 and PP 4: reconfigurations and the critical path (max CPU seconds of a rank per step;
   median, p90, worst).

Everything runs on the shared 2-core machine: timings are noisy (other jobs run beside), CPU seconds are printed
beside wall where rows have them. Usage: python benchmarks/reconfig.py [--ranks 8] [--steps 7] [--real-steps 12]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIG = """
[model]
name = "tiny"
attn_backend = "sdpa"
[world]
cluster = "cpux{ranks}"
[data]
source = "{source}"
max_len = {max_len}
tokens_per_step = {tokens}
[planner]
name = "flexpipe"
flexpipe_depths = "{depths}"
[optimizer]
warmup_steps = 2
decay_steps = 50
[train]
steps = {steps}
master_dtype = "float32"
progress = false
plan_ahead = 0
metrics = "{metrics}"
{extra}
"""


def train(tmp: Path, name: str, ranks: int, steps: int, depths: str, *, source: str = "stdlib:defs",
          max_len: int = 256, tokens: int = 2048, extra: str = "") -> tuple[list[dict], float, float, float]:
    """Run `tidal train`; returns (rows, first_row_s, last_row_s, exit_s): when the first and the last metrics row
    appeared and when the process exited, in seconds after launch."""
    metrics = tmp / f"{name}.jsonl"
    cfg = tmp / f"{name}.toml"
    cfg.write_text(CONFIG.format(ranks=ranks, source=source, max_len=max_len, tokens=tokens, depths=depths,
                                 steps=steps, metrics=metrics, extra=extra))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "train", "--config", str(cfg), "--nproc",
                             str(ranks)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = last = None
    seen = 0
    while proc.poll() is None:
        n = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        now = time.perf_counter() - t0
        if n > seen:
            first = now if first is None else first
            last, seen = now, n
        time.sleep(0.02)
    t_exit = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: tidal train exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    if seen < len(rows):  # rows written in the last poll interval
        last = t_exit
        first = t_exit if first is None else first
    return rows, first, last, t_exit


def stats(xs) -> str:
    xs = np.asarray(list(xs), dtype=float)
    if xs.size == 0:
        return "-"
    return f"median {np.median(xs):.3f}  p90 {np.percentile(xs, 90):.3f}  worst {xs.max():.3f}"


def live_and_restart(tmp: Path, ranks: int, steps: int) -> None:
    rows, *_ = train(tmp, "live", ranks, steps, "4,1")
    static, *_ = train(tmp, "static", ranks, 4, "1")
    base = statistics.median(r["pull_s"] for r in static[1:])
    print(f"== 1. live reconfiguration (tiny, {ranks} gloo ranks, fp32; depth cycled 4,1) ==")
    print(f"{'step':>4} {'strategy':<18} {'moved':>5} {'bytes':>10} {'param B':>10} {'ratio':>6} {'extra B':>10} "
          f"{'stall s':>8} {'excess s':>8}")
    for r in rows:
        if not r["reconfigured"]:
            continue
        print(f"{r['step']:>4} {r['strategy']:<18} {r['moved_groups']:>5} {r['reconfig_bytes']:>10} "
              f"{r['moved_param_bytes']:>10} {r['reconfig_bytes_ratio']:>6.3f} {r['reconfig_extra_bytes']:>10} "
              f"{r['reconfig_stall_s']:>8.3f} {r['reconfig_stall_s'] - base:>8.3f}")
    grow = [r for r in rows if r["reconfigured"] and r["moved_groups"] > 0]
    print(f"static depth-1 step's pull (the baseline every step pays): median {base:.3f} s over {len(static) - 1}")
    print(f"live stall (pull wall time of a reconfigured step that moves layers): {stats(r['pull_s'] for r in grow)}")
    print(f"bytes received / moved layers' parameter bytes: {stats(r['reconfig_bytes_ratio'] for r in grow)}")

    ck = tmp / "ckpt"
    a, _, a_last, a_exit = train(tmp, "restart-a", ranks, 2, "4", extra=f'checkpoint_dir = "{ck}"\n'
                                 'checkpoint_every = 2\nasync_checkpoint = false')
    b, b_first, _, _ = train(tmp, "restart-b", ranks, 3, "1", extra=f'checkpoint_dir = "{ck}"\nresume = true\n'
                             'checkpoint_every = 0')
    save = a_exit - a_last
    start = b_first - b[0]["loop_s"]
    print("== 2. checkpoint-and-restart of the same change (PP 4 -> 8 x PP 1) ==")
    print(f"A's last row to exit (synchronous save + teardown): {save:.2f} s; B's launch to its first step "
          f"(spawn, imports, groups, stage models, warm-up, load): {start:.2f} s; stall {save + start:.2f} s")
    print(f"live: {statistics.median(r['pull_s'] for r in grow):.3f} s (median pull of a reconfigured step) vs "
          f"checkpoint-and-restart {save + start:.2f} s   [FlexPipe: 0.79 s vs 7.16 s]")


def flanv2_planner() -> None:
    from tidal.baselines.flexpipe import FlexPipePlanner, fit_table2
    from tidal.baselines.flexpipe_steps import FlexPipeStepPlanner, reconfigurations
    from tidal.core import get_cluster, get_model
    from tidal.core.cluster import GB, ClusterSpec, DeviceType, NodeGroup
    from tidal.core.model import ModelSpec
    from tidal.costmodel.analytic import AnalyticCostModel
    from tidal.data.sampler import TokenBudgetSampler
    from tidal.data.sources import length_source

    a100 = DeviceType("a100", 312e12, 80 * GB, 300 * GB, 50 * GB, per_node=4)
    gpt = ModelSpec("gpt-3.35b", 16, 4096, 32, 32, 16384, 50257)
    print("== 3a. HBSA alone, 100 planned steps of synthetic:flanv2 (4 context windows of tokens per step) ==")
    cells = [(gpt, ClusterSpec(f"a100x{n}(4/node)", (NodeGroup(a100, n),)), ml, fit_table2(gpt))
             for n, ml in ((8, 4096), (16, 4096), (16, 8192))]
    cells.append((get_model("tiny"), get_cluster("cpux8"), 1024, None))
    for model, cl, ml, wm in cells:
        hb = FlexPipePlanner(AnalyticCostModel(model, cl), workload_memory=wm)
        src = TokenBudgetSampler(length_source("synthetic:flanv2", 0), 4 * ml, ml, seed=0)
        pl = FlexPipeStepPlanner(hb, (), src)
        ch = [pl.decide([int(x) for x in src.next_step().lengths]) for _ in range(100)]
        acts = collections.Counter(c.action for c in ch)
        depths = collections.Counter(c.depth for c in ch)
        print(f"{model.name:<10} {cl.name:<16} max_len {ml:>5}: {reconfigurations(ch)} reconfigurations per 100 "
              f"steps; actions {dict(acts)}; depths {dict(sorted(depths.items()))}")


def flanv2_real(tmp: Path, ranks: int, steps: int) -> None:
    print(f"== 3b. real runs: tiny, {ranks} gloo ranks, random:synthetic:flanv2 (max_len 1024, 4096 tokens/step), "
          f"{steps} steps ==")
    kw = dict(source="random:synthetic:flanv2", max_len=1024, tokens=4096)
    for name, depths in (("hbsa", ""), ("static-pp2", "2"), ("static-pp4", "4")):
        rows, *_ = train(tmp, f"flan-{name}", ranks, steps, depths, **kw)
        n = sum(r["reconfigured"] for r in rows)
        cp = [r["critical_path_s"] for r in rows[1:]]
        print(f"{name:<11} strategies {dict(collections.Counter(r['strategy'] for r in rows))}; reconfigurations "
              f"{n} in {len(rows)} steps ({100 * n / max(1, len(rows) - 1):.1f} per 100); critical path CPU s "
              f"{stats(cp)}; sum {sum(cp):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--real-steps", type=int, default=12)
    ap.add_argument("--only", choices=("live", "planner", "real"), default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.only in (None, "live"):
            live_and_restart(tmp, args.ranks, args.steps)
        if args.only in (None, "planner"):
            flanv2_planner()
        if args.only in (None, "real"):
            flanv2_real(tmp, args.ranks, args.real_steps)


if __name__ == "__main__":
    main()
