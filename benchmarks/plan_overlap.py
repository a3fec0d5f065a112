"""Planner time on the critical path of `tidal train`, with and without planning overlap (issue 11 part 4).

Runs the same short training job three ways, on the same documents:

- ``inline``: ``[train] plan_ahead = 0``, rank 0 plans each step before broadcasting it;
- ``ahead``: ``[train] plan_ahead = D`` (default 2), a background process plans the next steps while a step trains;
- ``off``: planning off, the plans computed beforehand and replayed (`runtime.planahead.ReplayPlanner`), so the step
  time is that of training alone.

The planner is made heavy on purpose (exact MILP dispatch and packing over several hand-picked candidates: 0.2-1.3 s
per step here at max_len 1,024 and 8,192 tokens per step), so that it is visible next to a CPU training step. Prints
per mode the median and p90 of ``plan_wait_s`` (rank 0's wait for the plan: planning on the critical path),
``plan_s`` (the planner's own time, in whichever process it ran), ``loop_s`` (rank 0's whole step: plan wait,
broadcast, training, metrics), ``wall_s`` (the slowest rank's training step) and ``critical_path_s`` (the busiest
rank's CPU time in the step, ``time.thread_time``: ranks share the cores), and checks that the three runs trained the
same documents with the same losses.

    python benchmarks/plan_overlap.py                    # 4 ranks, tiny Llama, stdlib:defs, 12 steps
    python benchmarks/plan_overlap.py --steps 20 --depth 3 --no-exact

Each mode is what ``tidal train --nproc 4`` runs (`runtime.train.train_worker` on spawned gloo ranks), with the
config printed first.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.planahead import InlinePlans, ReplayPlanner
from tidal.runtime.train import planner_spec, prepare, train_worker

FIELDS = ("plan_wait_s", "plan_s", "loop_s", "wall_s", "critical_path_s")


def config(args, plan_ahead: int) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig("tiny", "sdpa"), world=WorldConfig(f"cpux{args.nproc}"),
        data=DataConfig(args.data, args.max_len, args.tokens_per_step, "split", args.seed),
        planner=PlannerConfig(args.strategies, "hydraulis", exact=args.exact),
        optimizer=OptimConfig(lr=2e-3, warmup_steps=3, decay_steps=100),
        train=TrainSection(args.steps, args.seed, progress=False, plan_ahead=plan_ahead))


def run(job, factory=None) -> tuple[list[dict], float]:
    t = time.perf_counter()
    res = run_distributed(train_worker, job.world, job, None, True, factory, timeout_s=3000)[0]
    return res.rows, time.perf_counter() - t


def stats(rows: list[dict], f: str) -> str:
    x = np.array([r[f] for r in rows])
    return f"{np.median(x):.3f} / {np.percentile(x, 90):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--depth", type=int, default=2, help="plan_ahead of the overlapped run")
    ap.add_argument("--data", default="stdlib:defs")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--strategies", default="4*tp1;2*tp2;tp4;cp4;2*cp2;tp2+2*tp1;cp2+2*tp1")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True,
                    help="exact MILP planning (heavy); --no-exact plans with the default heuristics")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the three modes in turn this many times (the machine's load drifts); steps are pooled")
    args = ap.parse_args()
    base = config(args, 0)
    print(f"# tidal train --nproc {args.nproc}: [data] source={args.data} max_len={args.max_len} "
          f"tokens_per_step={args.tokens_per_step}; [planner] strategies={args.strategies!r} exact={args.exact}; "
          f"[train] steps={args.steps} plan_ahead=0|{args.depth}")
    job0 = prepare(base, args.nproc)
    with InlinePlans(planner_spec(job0)) as plans:
        t = time.perf_counter()
        planned = [plans.next() for _ in range(args.steps)]
        t_plan = time.perf_counter() - t
    print(f"# planning {args.steps} steps alone: {t_plan:.2f} s ({t_plan / args.steps * 1e3:.0f} ms per step)")
    ahead = prepare(dataclasses.replace(base, train=dataclasses.replace(base.train, plan_ahead=args.depth)),
                    args.nproc)
    modes = (("inline", job0, None), (f"ahead (plan_ahead={args.depth})", ahead, None),
             ("off (replayed plans)", job0, ReplayPlanner([p for p in planned if p is not None])))
    runs: dict[str, list[tuple[list[dict], float]]] = {name: [] for name, _, _ in modes}
    for _ in range(args.repeats):
        for name, job, factory in modes:
            runs[name].append(run(job, factory))
    print(f"# {args.repeats} run(s) per mode, {args.steps} steps each; per step median / p90 over all runs' steps; "
          f"sums per run")
    print("| mode | " + " | ".join(f"{f} median / p90" for f in FIELDS)
          + " | step 0 plan_wait_s | Σ plan_wait_s | Σ loop_s | run wall |")
    print("|---|" + "---|" * (len(FIELDS) + 4))
    for name, rr in runs.items():
        rows = [r for rows, _ in rr for r in rows]
        first = ", ".join(f"{rows[0]['plan_wait_s']:.3f}" for rows, _ in rr)
        waits = ", ".join(f"{sum(r['plan_wait_s'] for r in rows):.2f}" for rows, _ in rr)
        loops = ", ".join(f"{sum(r['loop_s'] for r in rows):.2f}" for rows, _ in rr)
        walls = ", ".join(f"{w:.0f}" for _, w in rr)
        cells = " | ".join(stats(rows, f) for f in FIELDS)
        print(f"| {name} | {cells} | {first} | {waits} | {loops} | {walls} |")
    ref = [(r["docs_run"], r["strategy"], r["loss"]) for r in runs["inline"][0][0]]
    same = all([(r["docs_run"], r["strategy"], r["loss"]) for r in rows] == ref for rr in runs.values()
               for rows, _ in rr)
    print(f"# same documents, strategies and losses in every run: {same}")


if __name__ == "__main__":
    main()
