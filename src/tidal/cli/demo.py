"""`tidal demo`: a real training comparison on this machine, in about 2-3 minutes on 2 CPU cores, then a simulated one.

The `tiny` Llama trains on 2 gloo ranks (one per core, so wall time is the rank's own) on a corpus built on the fly
from the running Python's standard library (`stdlib:defs`: every top-level function or class of every stdlib module is
a document; byte tokens; real and long-tailed, nothing downloaded; documents above `--max-len` truncated). The planner
plans for a **memory budget per rank** (`--memory-gib`, `[world] memory_gib`; the memory model's figure, not enforced
by the OS) under which tp1 holds documents up to about 5,000 tokens and tp2 / cp2 the longest (8,192): the demo prints
the MaxLens and how many steps fit tp1. Two runs see the same steps and the same documents (one seeded sampler,
Hydraulis packing, which never delays a document):

* **Tidal**: dynamic heterogeneous strategies, candidates from the proposal DP (`strategies = "auto"`), chosen per
  step by the planner (2*tp1 where the step's documents fit tp1 and it is cheaper; tp2 / cp2 otherwise);
* **best static**: the homogeneous strategy (k identical pipelines over all ranks, any <TP, PP, CP>) with the least
  planned time over the same steps, kept for every step; under the budget it must use TP or CP on every step.

Both plan with a cost model fitted on this machine: the demo first profiles the tiny model's forward + backward on one
rank (about 10 s; `profile.csv` in the output directory) and unprofiled schemes scale the analytic model term by term.

**Honest figures.** Timings drift, so one run of each says little. The demo runs `--rounds` rounds (default 2) of
both, in one launch (the ranks start once), alternating the order (Tidal first, then static first: ABBA cancels a
linear drift). Per round, ratio = static / Tidal (above 1: Tidal is faster) of wall time, critical path and critical
path with communication threads; the demo reports their median and range and, beside it, the **noise floor**: how
much runs of the *same* strategy on the same documents differ, (max - min) / median of their totals, the larger of the
two strategies'. A ratio whose distance from 1 is below the noise floor is reported as "within noise". One sentence
then says what the wall-time figure means.

It prints a table (per run: strategies and their step counts, wall time, critical path = the slowest rank's CPU time
per step, pull/push share, loss), the ratios with their noise floors, and writes `demo.png` (loss curves overlaid,
per-step critical path of the first round) and the runs' JSONL metrics (`tidal.jsonl`, `static.jsonl`, every row with
its `round`). Last, a **simulated** section (`cli/demo_sim.py`, `--sim-steps`, a few seconds): the speed-up of Tidal
and Hydraulis over the best static strategy on a simulated A800 cluster, from Hydraulis' measured strategy pools where
they are found (`--pools`), else from the analytic A800 model, and labelled as not measured.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tidal.cli import args as argtypes
from tidal.cli.demo_sim import strategy_counts
from tidal.core.errors import TidalError

DEMO_LOSS_RTOL = 1e-3  # float32 runs of the same documents under different strategies (see docs/training.md)
# 2 ranks (one per core of a small machine); a per-rank memory budget under which the planner's memory model lets tp1
# hold documents up to about 5,000 tokens and tp2/cp2 up to 8,192 (docs/training.md, "`tidal demo`"; decision 93)
DEFAULTS = {"steps": 10, "nproc": 2, "max_len": 8192, "tokens_per_step": 8192, "memory_gib": 0.2,
            "long_docs": "truncate"}


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train Tidal vs the best static strategy on 2 CPU ranks; table + PNG; "
                                     "then a simulated A800 cluster", description=__doc__)
    p.add_argument("--steps", type=argtypes.positive, default=DEFAULTS["steps"], help="training steps per run")
    p.add_argument("--nproc", type=argtypes.positive, default=DEFAULTS["nproc"],
                   help="local gloo ranks (one per core measures wall time honestly)")
    p.add_argument("--max-len", type=argtypes.max_len, default=DEFAULTS["max_len"], help="context length")
    p.add_argument("--tokens-per-step", type=argtypes.tokens_per_step, default=DEFAULTS["tokens_per_step"],
                   help="tokens per step")
    p.add_argument("--memory-gib", type=argtypes.finite_float(0.0, 1e6, low_open=True),
                   default=DEFAULTS["memory_gib"],
                   help="memory per rank the planner plans for (GiB; not enforced): small enough that the longest "
                        "documents need TP or CP and short ones do not")
    p.add_argument("--long-docs", choices=("split", "truncate"), default=DEFAULTS["long_docs"],
                   help="documents longer than --max-len")
    p.add_argument("--data", default="stdlib:defs", help="corpus, as [data] source")
    p.add_argument("--out", type=Path, default=Path("tidal-demo"), help="directory for metrics and demo.png")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="data and initialisation seed")
    p.add_argument("--rounds", type=argtypes.positive, default=2,
                   help="rounds of Tidal and static runs, order alternating; 2 or more measure the noise floor")
    p.add_argument("--sim-steps", type=argtypes.seed, default=4,
                   help="steps of the simulated A800 section (0: skip it)")
    p.add_argument("--pools", type=Path, default=None,
                   help="directory of Hydraulis' strategy pools for the simulated section (default: "
                        "../shared/data/hydraulis-profiles beside the source tree; analytic A800 model if absent)")
    p.set_defaults(func=run)


def homogeneous_strategies(spec, world: int) -> list[str]:
    """Every k*scheme that fills `world` ranks and is valid for the model."""
    from tidal.core.scheme import ParallelScheme

    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            for cp in (1, 2, 4, 8):
                s = ParallelScheme(tp, pp, cp)
                if world % s.num_devices:
                    continue
                try:
                    s.validate(spec)
                except TidalError:
                    continue
                k = world // s.num_devices
                out.append(f"{k}*{s.short()}" if k > 1 else s.short())
    return out


def base_config(args, strategies: str, metrics: str, cost_model: str = ""):
    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.optim import OptimConfig

    return TrainConfig(
        model=ModelConfig("tiny", "sdpa"), world=WorldConfig(f"cpux{args.nproc}", args.memory_gib),
        data=DataConfig(args.data, args.max_len, args.tokens_per_step, args.long_docs, args.seed),
        planner=PlannerConfig(strategies, "hydraulis", "adaptive", False, cost_model),
        optimizer=OptimConfig(lr=2e-3, warmup_steps=3, decay_steps=max(args.steps, 1)),
        train=TrainSection(args.steps, args.seed, "1f1b", "float32", "float32", metrics, True))


def best_static(args, tidal_job, cost_model: str) -> tuple[str, dict[str, float]]:
    """The homogeneous strategy with the least planned time over the demo's steps (same cost model and sampler)."""
    from tidal.runtime.job import make_planner, prepare

    planned: dict[str, float] = {}
    for text in homogeneous_strategies(tidal_job.spec, args.nproc):
        try:
            job = prepare(base_config(args, text, "", cost_model), args.nproc)
        except TidalError:  # does not fit memory at this max-len, etc.
            continue
        planner, _ = make_planner(job)
        planned[text] = sum(ps.plan.est_step_time for ps in planner.steps(args.steps))
    if not planned:
        raise TidalError(f"no homogeneous strategy can run max-len {args.max_len} on {args.nproc} ranks")
    return min(planned, key=planned.get), planned


def calibrate(path: Path, max_len: int, seed: int) -> str:
    """Profile tp1 forward+backward on this CPU and write the profile both runs plan with (docs/costmodel.md)."""
    import torch

    from tidal.core.cluster import get_cluster
    from tidal.core.model import get_model
    from tidal.costmodel.loader import load_cost_model
    from tidal.runtime.profile import compositions, profile_tp1, write_profile

    torch.set_num_threads(1)
    spec = get_model("tiny")
    totals = [t for t in (256, 512, 1024, 2048) if t <= max(256, max_len)]
    write_profile(path, spec, "cpu", "tp1pp1cp1", profile_tp1(spec, compositions(totals, seed)))
    return load_cost_model(path, spec, get_cluster("cpux4")).describe()


def run(args) -> int:
    from tidal.cli import render
    from tidal.cli.train import launch
    from tidal.runtime.job import prepare

    if args.steps < 1 or args.nproc < 1:
        raise TidalError("--steps and --nproc must be >= 1")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TidalError(f"cannot create {args.out}: {e.strerror}") from None
    con = render.console()
    profile = args.out / "profile.csv"
    con.print(f"profiling forward+backward of the tiny model on this CPU -> {profile} ...")
    fit = calibrate(profile, args.max_len, args.seed)
    con.print(f"cost model: {fit}")
    tidal_job = prepare(base_config(args, "auto", "", str(profile)), args.nproc)  # rows written below
    static, planned = best_static(args, tidal_job, str(profile))
    static_job = prepare(base_config(args, static, "", str(profile)), args.nproc)
    budget = memory_budget(tidal_job)
    con.print(f"corpus {args.data}: {args.steps} steps of ~{args.tokens_per_step:,} tokens, max-len {args.max_len} "
              f"(longer documents: {args.long_docs}), {args.nproc} ranks")
    con.print(f"memory budget {args.memory_gib:g} GiB per rank (the planner's memory model; not enforced): MaxLen "
              + ", ".join(f"{k} {v:,}" for k, v in budget.items()) + " tokens")
    if "tp1" in budget:
        longest = step_longest(tidal_job, args.steps)
        fit = sum(n <= budget["tp1"] for n in longest)
        con.print(f"steps whose documents all fit tp1: {fit} of {len(longest)} (longest document per step: "
                  f"{', '.join(f'{n:,}' for n in longest)}); the others need TP or CP")
    con.print(f"Tidal candidates: {', '.join(str(s) for s in tidal_job.candidates)}")
    con.print("best static by planned time: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(
        planned.items(), key=lambda kv: kv[1])[:5]) + f" -> [bold]{static}[/]")
    order = run_order(args.rounds)
    con.print(f"training {len(order)} runs in one launch ({args.rounds} rounds, order "
              f"{' '.join('T' if n == 'tidal' else 'S' for n in order)}; T = Tidal, S = static) ...")
    jobs = {"tidal": tidal_job, "static": static_job}
    got = launch(tidal_job, rounds_entry, jobs, order, nproc=args.nproc, timeout_s=None,
                 collective_timeout_s=tidal_job.config.train.collective_timeout_s, watch=True)[0]
    rounds = [{} for _ in range(args.rounds)]
    for (k, name), rows in zip(enumerate(order), got):
        rounds[k // 2][name] = rows
    for name in ("tidal", "static"):
        with open(args.out / f"{name}.jsonl", "w") as f:
            for k, r in enumerate(rounds):
                for row in r[name]:
                    f.write(json.dumps({**row, "round": k + 1}) + "\n")
    summary = summarize(rounds)
    render.demo_table(con, summary, static)
    con.print(meaning(summary, static, budget))
    png = args.out / "demo.png"
    plot(rounds[0], static, png)
    con.print(f"wrote {png}, {args.out / 'tidal.jsonl'}, {args.out / 'static.jsonl'}")
    if args.sim_steps:
        from tidal.cli.demo_sim import print_section, simulate_section

        print_section(con, simulate_section(args.sim_steps, args.pools, args.seed))
    return 0


def memory_budget(job) -> dict[str, int]:
    """MaxLen (tokens) of tp1, tp2 and cp2 under the job's cost model and per-rank memory (the planner's view)."""
    from tidal.core.scheme import ParallelScheme

    dev, cm = job.cluster.groups[0].device, job.cost_model()
    out = {}
    for name, sch in (("tp1", ParallelScheme(1, 1, 1)), ("tp2", ParallelScheme(2, 1, 1)),
                      ("cp2", ParallelScheme(1, 1, 2))):
        if sch.num_devices <= job.cluster.num_devices:
            out[name] = int(cm.max_len(sch, dev))
    return out


def step_longest(job, steps: int) -> list[int]:
    """The longest sequence of each of the first `steps` steps (the planner's view of the demo's data)."""
    from tidal.runtime.job import make_planner

    planner, _ = make_planner(job)
    return [int(max(ps.plan.seq_lengths, default=0)) for ps in planner.steps(steps)]


def meaning(s: dict, static: str, budget: dict[str, int]) -> str:
    """One plain sentence on what the wall-time figure says."""
    w = s["wall"]
    tp1 = budget.get("tp1")
    head = (f"What this means: over the same documents, the best static strategy ({static}) took {w['median']:.3f}x "
            f"Tidal's wall time (median of {len(s['rounds'])} round(s)). ")
    if w["noise"] is None:
        return head + "With one round the noise floor is unknown, so this single ratio may be noise."
    if w["verdict"] == "within noise":
        return head + (f"That is within the noise floor ({w['noise']:.1%}): on this machine the two cannot be told "
                       f"apart.")
    if w["median"] < 1:
        return head + (f"{static} is faster by more than the noise floor ({w['noise']:.1%}): Tidal's per-step choices "
                       f"cost more here than the planner's cost model predicted.")
    why = (f" Tidal runs data-parallel tp1 ranks on steps whose documents all fit tp1's {tp1:,}-token MaxLen (where "
           f"its cost model prefers them) and TP/CP on the others; the static strategy pays TP/CP on every step."
           if tp1 is not None else "")
    return head + f"Tidal is faster by more than the noise floor ({w['noise']:.1%}).{why}"


def run_order(rounds: int) -> list[str]:
    """Tidal and static per round, alternating which goes first (T S, S T, T S, ...)."""
    return [n for k in range(rounds) for n in (("tidal", "static") if k % 2 == 0 else ("static", "tidal"))]


def rounds_entry(rank: int, world: int, job, jobs: dict, order: list[str], progress=None) -> list[list[dict]]:
    """Every rank: the runs of `order` one after the other in this process group (each builds its executor and
    warms up before its timed steps); rank 0 returns their rows and prints one line per run."""
    from tidal.runtime.train import train_worker

    out = []
    for i, name in enumerate(order):
        rows = train_worker(rank, world, jobs[name], progress=progress).rows
        out.append(rows)
        if rank == 0:
            print(f"  round {i // 2 + 1} {name}: {len(rows)} steps, critical path "
                  f"{sum(r['critical_path_s'] for r in rows):.2f} s, wall {sum(r['wall_s'] for r in rows):.2f} s",
                  flush=True)
    return out


def spread(xs: list[float]) -> float | None:
    """(max - min) / median; None for fewer than two values."""
    if len(xs) < 2:
        return None
    return (max(xs) - min(xs)) / float(np.median(xs))


def ratio_stats(rounds: list[dict], key: str) -> dict:
    """static / Tidal per round of `key` (a run total), with the noise floor: the larger spread of the same
    strategy's totals over the rounds. `verdict`: "within noise" when |median ratio - 1| is below it."""
    t = [r["tidal"][key] for r in rounds]
    s = [r["static"][key] for r in rounds]
    ratios = [b / a for a, b in zip(t, s)]
    noise = None if len(rounds) < 2 else max(spread(t), spread(s))
    med = float(np.median(ratios))
    if noise is None:
        verdict = "noise not measured (one round)"
    elif abs(med - 1) <= noise:
        verdict = "within noise"
    else:
        verdict = "Tidal faster" if med > 1 else "static faster"
    return {"median": med, "min": min(ratios), "max": max(ratios), "noise": noise, "verdict": verdict,
            "ratios": ratios}


def summarize(rounds: list[dict[str, list[dict]]]) -> dict:
    """`rounds[k]` = {"tidal": rows, "static": rows}: each round's comparison (`compare`) and the ratios of the run
    totals with their noise floors."""
    per = [compare(r["tidal"], r["static"]) for r in rounds]
    return {"rounds": per, "steps": per[0]["steps"], "same_documents": all(p["same_documents"] for p in per),
            "max_loss_rel_diff": max(p["max_loss_rel_diff"] for p in per),
            "loss_agree": all(p["loss_agree"] for p in per),
            "critical_path": ratio_stats(per, "critical_path_s"),
            "process_critical_path": ratio_stats(per, "process_critical_path_s"),
            "wall": ratio_stats(per, "wall_s")}


def compare(dyn: list[dict], sta: list[dict]) -> dict:
    """Figures of the comparison (both runs over the same steps)."""
    n = min(len(dyn), len(sta))
    dyn, sta = dyn[:n], sta[:n]
    same_docs = all(a["tokens"] == b["tokens"] and a["documents"] == b["documents"] for a, b in zip(dyn, sta))

    def tot(rows, key):
        return float(sum(r[key] for r in rows))

    out = {"steps": n, "same_documents": same_docs}
    for name, rows in (("tidal", dyn), ("static", sta)):
        wall = tot(rows, "wall_s")
        out[name] = {"wall_s": wall, "critical_path_s": tot(rows, "critical_path_s"),
                     "process_critical_path_s": tot(rows, "process_critical_path_s"),
                     "busy_sum_s": float(sum(sum(r["busy_s"]) for r in rows)),
                     "pull_push_share": (tot(rows, "pull_s") + tot(rows, "push_s")) / wall if wall else 0.0,
                     "pull_push_cpu_share": float(sum(sum(r["pull_cpu_s"]) + sum(r["push_cpu_s"]) for r in rows)
                                                  / max(sum(sum(r["busy_s"]) for r in rows), 1e-12)),
                     "tokens": int(tot(rows, "tokens")), "final_loss": rows[-1]["loss"],
                     "imbalance": float(np.mean([r["imbalance"] for r in rows])),
                     "strategies": sorted({r["strategy"] for r in rows}),
                     "strategy_steps": strategy_counts([r["strategy"] for r in rows])}
    out["speedup_critical_path"] = out["static"]["critical_path_s"] / out["tidal"]["critical_path_s"]
    out["speedup_wall"] = out["static"]["wall_s"] / out["tidal"]["wall_s"]
    out["speedup_process_critical_path"] = (out["static"]["process_critical_path_s"] /
                                            out["tidal"]["process_critical_path_s"])
    rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(dyn, sta) if math.isfinite(b["loss"])]
    out["max_loss_rel_diff"] = max(rel, default=0.0)
    out["loss_agree"] = out["max_loss_rel_diff"] <= DEMO_LOSS_RTOL
    return out


def plot(runs: dict[str, list[dict]], static: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = {"tidal": "Tidal (dynamic heterogeneous)", "static": f"best static ({static})"}
    for name, rows in runs.items():
        ax1.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker="o", ms=3, label=labels[name],
                 ls="-" if name == "tidal" else "--")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss (mean token cross-entropy)")
    ax1.set_title("loss: same documents per step")
    ax1.legend()
    width = 0.4
    for k, (name, rows) in enumerate(runs.items()):
        xs = np.arange(len(rows)) + (k - 0.5) * width
        ax2.bar(xs, [r["critical_path_s"] for r in rows], width, label=labels[name])
    ax2.set_xlabel("step")
    ax2.set_ylabel("critical path (s): slowest rank's CPU time")
    ax2.set_title("per-step critical path")
    top = max(r["critical_path_s"] for rows in runs.values() for r in rows)
    ax2.set_ylim(0, top * 1.3)  # room for the strategy labels above the bars
    ax2.legend(loc="upper left", fontsize=8)
    for r, x in zip(runs["tidal"], np.arange(len(runs["tidal"]))):
        ax2.annotate(r["strategy"], (x - 0.5 * width, r["critical_path_s"]), rotation=90, fontsize=7,
                     ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["add_parser", "best_static", "compare", "homogeneous_strategies", "plot", "ratio_stats", "run",
           "run_order", "summarize"]
