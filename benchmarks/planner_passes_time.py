"""What each of the planner's improvement passes earns and costs, every set of passes measured interleaved on the
same steps (decisions 95, 113, 159).

Every step of every cell is planned once with each set of passes, in one process, the sets in turn (their order
rotated by one each step), so every set sees the same machine load and the same candidates. Per cell it prints each
set's median and p90 CPU ms per step (time.thread_time) and its median est/bound. Then, for every set after the
first, the change in the cell-median est/bound against the first set (mean and worst over cells, relative, in %), the
number of steps whose reported bound differs from the first set's (the bound is the least bound of the candidates
that could have won, so a plan can move it; where it does not, est/bound changes are est changes), and its CPU time
against the first set's (total over all steps). Cells are planner_grid.py's (select_step, seed 0, no
budget: the same plans and est/bound medians as `planner.py --grid` with --passes/--drop), with hand or proposal
candidates.

    python benchmarks/planner_passes_time.py [--sets all,-late_restarts,-shrink,-polish,-fill,-repair,-exchange]
        [--cands hand|proposal] [--models ..] [--clusters ..] [--sources ..] [--seeds 10,11,12] [--steps 5]
        [--out rows.json]  (the rows: every step's CPU ms, est, bound and est/bound per set)
    python benchmarks/planner_passes_time.py --a all --b none  (decision 95's two-set form: --sets all,none)

A set is 'all', 'none', '-NAME' (all passes less one) or pass names (config.PASS_ORDER) joined by '+' ('--a' and
'--b' also take them joined by ','). The defaults are the held-out split of the grid: seeds 10-12 on the four tuning
sources and stdlib.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from planner_grid import MAX_LEN, TOKENS, Grid, q, warm_kernels

from tidal.core import TidalError, get_cluster
from tidal.data import sample_steps
from tidal.planner.config import PASS_ORDER, PlannerConfig
from tidal.planner.select import select_step


def config(spec: str) -> PlannerConfig:
    """The config of one set (module doc); an unknown pass name is a one-line TidalError."""
    if spec == "all":
        names: tuple[str, ...] = PASS_ORDER
    elif spec == "none":
        names = ()
    elif spec.startswith("-") and spec[1:] in PASS_ORDER:
        names = tuple(x for x in PASS_ORDER if x != spec[1:])
    else:
        names = tuple(x for x in spec.replace(",", "+").split("+") if x)
    unknown = [x for x in names if x not in PASS_ORDER]
    if unknown:
        raise TidalError(f"unknown pass in set {spec!r}; the passes are {', '.join(PASS_ORDER)}")
    return PlannerConfig(passes=tuple(x for x in PASS_ORDER if x in names))


def run_cell(grid: Grid, model: str, cluster: str, how: str, source: str, seeds, steps: int, cfgs) -> dict | None:
    """One cell: per set, the CPU ms and est/bound of every step (None: the cell has no candidates)."""
    _, profs, _ = grid.candidates(model, cluster, how, source)
    if not profs:
        return None
    cpu: list[list[float]] = [[] for _ in cfgs]
    ratio: list[list[float]] = [[] for _ in cfgs]
    est: list[list[float]] = [[] for _ in cfgs]
    lb: list[list[float]] = [[] for _ in cfgs]
    n = 0
    for seed in seeds:
        for st in sample_steps(grid.specs[source], seed=seed, max_len=MAX_LEN, steps=steps,
                               tokens_per_step=TOKENS[get_cluster(cluster).num_devices])[0]:
            l_ = st.lengths_array()
            if int(l_.max()) > max(p.max_len for p in profs):
                continue  # no candidate holds its longest document (the grid counts it failed)
            for i in range(len(cfgs)):
                k = (i + n) % len(cfgs)
                c0 = time.thread_time()
                plan = select_step(l_, profs, seed=0, config=cfgs[k]).plan
                cpu[k].append((time.thread_time() - c0) * 1e3)
                ratio[k].append(plan.est_step_time / plan.lower_bound if plan.lower_bound else 1.0)
                est[k].append(plan.est_step_time)
                lb[k].append(plan.lower_bound)
            n += 1
    return {"model": model, "cluster": cluster, "cands": how, "source": source, "steps": n, "cpu": cpu,
            "ratio": ratio, "est": est, "lb": lb, "r_med": [q(r, .5) for r in ratio]}


def warm(grid: Grid, args, cfgs) -> None:
    """Load the compiled loops, and plan the first cell's first step with every set once, untimed, so that no set's
    timed step pays for a first call."""
    warm_kernels()
    model, cluster, source = (args.models.split(",")[0], args.clusters.split(",")[0], args.sources.split(",")[0])
    _, profs, _ = grid.candidates(model, cluster, args.cands, source)
    if profs:
        l_ = sample_steps(grid.specs[source], seed=0, max_len=MAX_LEN, steps=1,
                          tokens_per_step=TOKENS[get_cluster(cluster).num_devices])[0][0].lengths_array()
        if int(l_.max()) <= max(p.max_len for p in profs):
            for cfg in cfgs:
                select_step(l_, profs, seed=0, config=cfg)


def summary(rows: list[dict], sets: list[str]) -> None:
    """Each set against the first: est/bound change per cell (mean, worst) and CPU time (total and mean per step)."""
    tot = [sum(sum(r["cpu"][k]) for r in rows) for k in range(len(sets))]
    nsteps = sum(r["steps"] for r in rows)
    print(f"\n{len(rows)} cells, {nsteps} steps; the change in cell-median est/bound against {sets[0]!r} (relative, %)")
    print("| set | est/bound change: mean | worst (cell) | cells > 0.05 % | steps, bound differs | cpu ms per step: "
          "mean | max | vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for k, name in enumerate(sets):
        d = [(r["r_med"][k] / r["r_med"][0] - 1) * 100 for r in rows]
        w = int(np.argmax(d)) if d else 0
        cell = f"{rows[w]['model']} {rows[w]['cluster']} {rows[w]['source']}" if d and d[w] > 0 else "-"
        moved = sum(a != b for r in rows for a, b in zip(r["lb"][k], r["lb"][0]))
        print(f"| {name} | {np.mean(d):+.4f} | {d[w]:+.4f} ({cell}) | {sum(x > 0.05 for x in d)} | {moved} | "
              f"{tot[k] / max(nsteps, 1):.2f} | {max((max(r['cpu'][k]) for r in rows), default=0):.1f} | "
              f"{tot[k] / tot[0]:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="all,-late_restarts,-shrink,-polish,-fill,-repair,-exchange,none",
                    help="sets of passes, ',' between sets (module doc)")
    ap.add_argument("--a", default=None, help="two-set form (instead of --sets): the first set (default all)")
    ap.add_argument("--b", default=None, help="two-set form: the second set (default none)")
    ap.add_argument("--cands", choices=["hand", "proposal"], default="hand")
    ap.add_argument("--models", default="llama2-7b,llama2-13b,llama-32b")
    ap.add_argument("--clusters", default="a800x16,a800x64,a800x256")
    ap.add_argument("--sources", default="commoncrawl,github,flanv2,heavytail,stdlib")
    ap.add_argument("--seeds", default="10,11,12")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the rows (every step's CPU ms and est/bound) as JSON")
    args = ap.parse_args()
    sets = [args.a or "all", args.b or "none"] if args.a or args.b else [x for x in args.sets.split(",") if x]
    try:
        cfgs = [config(s) for s in sets]
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except (TidalError, ValueError) as e:
        raise SystemExit(f"planner_passes_time: {e}") from None
    print(f"sets {sets} = {[c.passes for c in cfgs]}; {args.cands} candidates; seeds {seeds}, {args.steps} steps "
          f"each; CPU ms per step (thread_time)")
    print("| model | cluster | source | steps | " + " | ".join(f"{s} cpu med / p90 | {s} est/lb med" for s in sets)
          + " |")
    print("|---|---|---|---|" + "---|---|" * len(sets))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        grid = Grid(Path(tmp))
        warm(grid, args, cfgs)
        for model in args.models.split(","):
            for cluster in args.clusters.split(","):
                for source in args.sources.split(","):
                    row = run_cell(grid, model, cluster, args.cands, source, seeds, args.steps, cfgs)
                    if row is None:
                        print(f"| {model} | {cluster} | {source} | no candidates |", flush=True)
                        continue
                    rows.append(row)
                    print(f"| {model} | {cluster} | {source} | {row['steps']} | " + " | ".join(
                        f"{q(c, .5):.1f} / {q(c, .9):.1f} | {r:.4f}" for c, r in zip(row["cpu"], row["r_med"]))
                        + " |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"sets": sets, "rows": rows}, default=float))
    summary(rows, sets)


if __name__ == "__main__":
    main()
