"""Simulator validity (issue 10, "must show"): simulated vs measured step time of real `tidal train` steps.

1. `tidal profile` of the tiny model on cpux4 for every scheme the strategies use (or `--cost-model FILE`);
2. per strategy and seed, a `tidal train` run (tiny, cpux4, one candidate, `--steps` steps of the stdlib corpus)
   planned with that profile, its metrics saved under `--out`;
3. each step's plan re-made by the same deterministic `StepPlanner` (same config; checked against the row's
   per-pipeline features) and simulated with the same fitted cost model (`tidal.simulator.validity`);
4. per strategy and overall: median, p90 and worst of |sim - meas| / meas for
   - busy: simulated max-device forward+backward seconds vs measured max-rank `compute_busy_s` (like with like:
     CPU time, bubbles are waiting and cost none);
   - per pipeline: the same per pipeline;
   - makespan: the simulated last backward end (bubbles and P2P included) vs the same measured busy time, which
     shows what the simulator's bubbles would add if they were work.

    python benchmarks/simulate_validity.py                                   # profile + 7 runs, ~15 min here
    python benchmarks/simulate_validity.py --cost-model p.json --seeds 0,1 --steps 20
    python benchmarks/simulate_validity.py --cost-model p.json --reuse        # re-analyse saved metrics

Wall time is printed for reference only: on this 2-core machine shared by 4 ranks and other sessions it measures
the scheduler (docs/training.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from tidal.cli.main import main as tidal
from tidal.core.scheme import parse_strategy
from tidal.runtime.calibration import read_metrics
from tidal.runtime.config import load_config
from tidal.runtime.train import make_planner, prepare
from tidal.simulator.engine import SimConfig, Simulator
from tidal.simulator.validity import check_row_matches, error_stats, simulate_compute

STRATEGIES = "4*tp1,2*tp2,tp4,2*cp2,tp2pp2,pp2+2*tp1,tp2+2*tp1"
CONFIG = """
[model]
name = "tiny"
attn_backend = "sdpa"
[world]
cluster = "cpux4"
[data]
source = "{source}"
max_len = {max_len}
tokens_per_step = {tokens}
seed = {seed}
[planner]
strategies = "{strategy}"
cost_model = "{cost_model}"
[optimizer]
lr = 2e-3
warmup_steps = 3
decay_steps = {steps}
[train]
steps = {steps}
seed = {seed}
progress = false
metrics = "{metrics}"
"""


def schemes_of(strategies: list[str]) -> str:
    names = []
    for s in strategies:
        for sch in parse_strategy(s):
            name = sch.short()
            if name not in names:
                names.append(name)
    return ",".join(names)


def fmt(s: dict) -> str:
    return f"{s['median']:6.1%} {s['p90']:6.1%} {s['worst']:6.1%} {s['bias']:+6.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("simulate-validity-out"))
    ap.add_argument("--cost-model", type=Path, default=None, help="reuse a fitted model from `tidal profile`")
    ap.add_argument("--strategies", default=STRATEGIES, help="comma-separated; one training run each")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=1, help="leading steps left out of the statistics")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--tokens-per-step", type=int, default=4096)
    ap.add_argument("--source", default="stdlib")
    ap.add_argument("--no-cp-imbalance", action="store_true",
                    help="simulate CP attention as a perfect 1/CP split (SimConfig.cp_imbalance = False)")
    ap.add_argument("--reuse", action="store_true", help="analyse existing metrics files instead of training")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    seeds = [int(x) for x in args.seeds.split(",")]
    profile = args.cost_model
    if profile is None:
        profile = args.out / "profile.json"
        t0 = time.thread_time()
        rc = tidal(["profile", "--model", "tiny", "--cluster", "cpux4", "--schemes", schemes_of(strategies),
                    "--totals", "256,512,1024,2048,4096", "--mixes", "8,32", "--max-doc", str(args.max_len),
                    "--attn-backend", "sdpa", "--out", str(profile)])
        if rc:
            return rc
        print(f"# profile written to {profile} ({time.thread_time() - t0:.0f} s CPU here)", file=sys.stderr)

    results: dict[str, dict[str, list]] = {}
    for strategy in strategies:
        res = results.setdefault(strategy, {"busy": [], "pipe": [], "makespan": [], "wall": [],
                                                "stage": [[], []], "vs_pred": []})
        for seed in seeds:
            tag = strategy.replace("*", "x").replace("+", "_") + f"-s{seed}"
            cfg_path, metrics = args.out / f"{tag}.toml", args.out / f"{tag}.jsonl"
            cfg_path.write_text(CONFIG.format(source=args.source, max_len=args.max_len, tokens=args.tokens_per_step,
                                              seed=seed, strategy=strategy, cost_model=profile.resolve(),
                                              steps=args.steps, metrics=metrics.resolve()))
            if not (args.reuse and metrics.exists()):
                t0 = time.perf_counter()
                rc = tidal(["train", "--config", str(cfg_path), "--nproc", "4"])
                if rc:
                    return rc
                print(f"# {strategy} seed {seed}: {args.steps} steps in {time.perf_counter() - t0:.0f} s wall",
                      file=sys.stderr)
            rows = read_metrics(metrics)
            job = prepare(load_config(cfg_path))
            planner, _ = make_planner(job)
            cm = job.cost_model()
            sim = Simulator(cm, SimConfig(schedule=job.config.train.schedule,
                                          cp_imbalance=not args.no_cp_imbalance))
            for row in rows:
                ps = planner.next()
                if ps is None or ps.index != row["step"]:
                    raise SystemExit(f"{metrics}: re-planning lost step {row['step']}")
                check_row_matches(row, ps.plan, f"{metrics} step {row['step']}")
                if row["step"] < args.skip or not row["pipelines"]:
                    continue
                s = simulate_compute(sim, ps.plan)
                res["busy"].append((s.busy_s, row["measured_s"]))
                res["vs_pred"].append(s.busy_s / row["predicted_s"])
                res["makespan"].append((s.makespan_s, row["measured_s"]))
                res["pipe"] += [(b, q["measured_s"]) for b, q in zip(s.pipelines_busy_s, row["pipelines"])]
                busy = row["compute_busy_s"]
                for stages, ranks in zip(s.stages_busy_s, s.stage_ranks):
                    if len(stages) > 1:  # PP: every stage, the slowest (the fit) and the others (analytic shape)
                        slow = int(np.argmax(stages))
                        for k, (b, rs) in enumerate(zip(stages, ranks)):
                            res["stage"][k != slow].append((b, max(busy[r] for r in rs)))
                full = sim.simulate(ps.plan)
                res["wall"].append((full.step_time, row["wall_s"]))

    print(f"# simulated vs measured step time: tiny on cpux4 (4 gloo ranks), {args.source}, {args.steps} steps of "
          f"{args.tokens_per_step} tokens, max_len {args.max_len}, seeds {args.seeds}, first {args.skip} step(s) "
          f"skipped; cost model {profile}; CP imbalance {'off' if args.no_cp_imbalance else 'on'}")
    print("# |sim - meas| / meas: median p90 worst, and bias = median(sim / meas) - 1")
    print("# busy: sim max-device fwd+bwd seconds vs measured max-rank compute_busy_s (CPU time; like with like)")
    print("# pipeline: the same per pipeline; makespan: sim last backward end (bubbles, P2P) vs the same busy time")
    cols = f"{'median':>6} {'p90':>6} {'worst':>6} {'bias':>6}"
    print(f"{'':<12} {'':>5} | {'busy':<27} | {'pipeline':<27} | {'makespan':<27} |")
    print(f"{'strategy':<12} {'steps':>5} | {cols} | {cols} | {cols} | wall/sim")
    keys = ("busy", "pipe", "makespan", "wall")
    total = {k: [] for k in keys}
    for strategy, res in results.items():
        for k in keys:
            total[k] += res[k]
        wall = np.median([m / s for s, m in res["wall"]])
        print(f"{strategy:<12} {len(res['busy']):>5} | {fmt(error_stats(res['busy']))} | "
              f"{fmt(error_stats(res['pipe']))} | {fmt(error_stats(res['makespan']))} | {wall:8.2f}")
    wall = np.median([m / s for s, m in total["wall"]])
    print(f"{'all':<12} {len(total['busy']):>5} | {fmt(error_stats(total['busy']))} | "
          f"{fmt(error_stats(total['pipe']))} | {fmt(error_stats(total['makespan']))} | {wall:8.2f}")
    for strategy, res in results.items():
        for k, name in enumerate(("slowest (fitted)", "other (analytic shape)")):
            if res["stage"][k]:
                print(f"# {strategy} PP stages, {name}: {fmt(error_stats(res['stage'][k]))} "
                      f"(n={len(res['stage'][k])})")
    ratio = [x for r in results.values() for x in r["vs_pred"]]
    print(f"# simulated busy / the rows' calibration predicted_s (same model): min {min(ratio):.4f}, "
          f"max {max(ratio):.4f}")
    per_strategy = [error_stats(r["busy"])["median"] for r in results.values()]
    print(f"# busy, per-strategy medians: median {np.median(per_strategy):.1%}, "
          f"p90 {np.percentile(per_strategy, 90):.1%}, worst {max(per_strategy):.1%} (n={len(per_strategy)})")
    print("# wall/sim: median measured wall_s over the simulated full step (pull, push, optimizer included); "
          "reference only, the 4 ranks share 2 cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
