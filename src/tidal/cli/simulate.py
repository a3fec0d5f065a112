"""`tidal simulate`: plan and simulate steps of the same data under several systems and compare them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tidal.cli import args as argtypes
from tidal.core.errors import TidalError
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator.engine import SCHEDULES, SimConfig
from tidal.simulator.systems import SYSTEMS, SystemRun, Workload, parse_systems, run_system, speedups

PROPOSAL_SAMPLE = 20000


def add_parser(sub) -> None:
    from tidal.cli.plan import add_workload_args

    p = sub.add_parser("simulate", help="simulate steps under several systems (tidal, hydraulis, megatron, ...)",
                       description=__doc__,
                       usage="tidal simulate [--config FILE [--SECTION.KEY VALUE ...]] [options]")
    add_workload_args(p)
    p.add_argument("--cost-model", type=Path, default=None,
                   help="the planners' cost model: fitted model (.json), profile (.csv), Hydraulis strategy pool "
                        "(.json), analytic-v1 or analytic-eager; default: analytic from the specs")
    p.add_argument("--truth", default=None,
                   help="the device model the plans execute on, unseen by the planners (decision 77): 'analytic' or "
                        "any file --cost-model takes, e.g. a Hydraulis strategy pool; default: the planners' model")
    p.add_argument("--systems", default=",".join(n for n in SYSTEMS if not n.endswith("-paper")),
                   help=f"comma-separated, from {', '.join(SYSTEMS)} (default: all but the *-paper ones, which run "
                        "only the scenarios of Hydraulis Table 3)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule")
    p.add_argument("--fwd-share", type=argtypes.finite_float(0.0, 1.0, low_open=True, high_open=True), default=1 / 3,
                   help="forward share of forward+backward (1:2 = 1/3)")
    p.add_argument("--no-overlap", action="store_true", help="do not overlap gradient pull/push with compute")
    p.add_argument("--json", type=Path, default=None, help="write per-system step times here")
    p.add_argument("--report", type=Path, default=None, help="write index.html and PNG charts into this directory")
    p.add_argument("--gantt-system", default=None, help="system of the Gantt chart (default tidal, else the last)")
    p.add_argument("--gantt-step", type=argtypes.seed, default=None,
                   help="step of the Gantt chart (default the slowest)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def workload_of(args) -> Workload:
    """The workload of the flags, or with `--config` the training job's (cli/dryrun.py): its cost model, corpus and
    options, and its candidates and planning options for the `tidal` system."""
    from tidal.cli.dryrun import resolve
    from tidal.cli.plan import cost_model_from, cost_model_of

    job = resolve(args)
    if job is not None:
        truth = None if args.truth is None else cost_model_from(args.truth, job.cost_model.model,
                                                                job.cost_model.cluster)
        return Workload(job.cost_model, args.max_len, args.tokens_per_step, args.steps, args.seed, job.sampler,
                        job.sample, truth, tidal=(job.candidates, job.options))
    cm = cost_model_of(args)
    truth = None if args.truth is None else cost_model_from(args.truth, cm.model, cm.cluster)
    src = length_source(args.data, args.seed)
    sample = src.lengths(0, PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE))

    def factory():
        return TokenBudgetSampler(length_source(args.data, args.seed), args.tokens_per_step, args.max_len,
                                  long_docs=args.long_docs, seed=args.seed)

    return Workload(cm, args.max_len, args.tokens_per_step, args.steps, args.seed, factory, sample, truth)


def to_json(runs: list[SystemRun], meta: dict, errors: dict[str, str] | None = None) -> dict:
    sp = speedups(runs)
    return {
        "meta": meta,
        "errors": dict(errors or {}),
        "systems": {r.name: {"config": r.config, "step_times": r.step_times, "mean_step_time": r.mean_step_time,
                             "tokens_per_s": r.tokens_per_s, "tokens": r.tokens, "strategies": r.strategies,
                             "est_step_times": r.est_times, "switches": r.switches, "plan_s": r.plan_s,
                             "sim_s": r.sim_s} for r in runs},
        "speedup_vs_best_static": sp,
    }


STRATEGY_MIN_WIDTH = 30  # narrower than this beside the figures: the strategies get a table of their own
# sim_report.HEADER's figures, short enough for 80 columns
SHORT_HEADER = ("system", "step s", "tokens/s", "vs static", "steps", "sw", "plan s", "sim s")


def sim_tables(runs: list[SystemRun], sp: dict[str, float], title: str, width: int) -> list:
    """The results as Rich tables for a console `width` columns wide: the figures per system and the strategies
    every system ran (not its candidates). A system's name and the figures never wrap or get cut; the strategies
    fold onto more lines, beside the figures when at least STRATEGY_MIN_WIDTH columns remain, else in a second
    table (system, strategies) below."""
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    from tidal.cli import sim_report

    rows = sim_report.table_rows(runs, sp)
    heads = SHORT_HEADER
    name_w = max(len(r.name) for r in runs)

    def figures() -> Table:
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for h in heads:
            if h == "system":
                t.add_column(h, justify="left", no_wrap=True, min_width=name_w)
            else:
                t.add_column(h, justify="right", no_wrap=True)
        return t

    t = figures()
    for row in rows:
        t.add_row(*row[:len(heads)])
    con = Console(width=10**4)
    need = Measurement.get(con, con.options, t).maximum
    if width - need >= STRATEGY_MIN_WIDTH:
        t = figures()
        t.add_column(sim_report.HEADER[-2], justify="left", overflow="fold", min_width=STRATEGY_MIN_WIDTH)
        for row in rows:
            t.add_row(*row[:len(heads) + 1])
        return [t]
    s = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    s.add_column("system", no_wrap=True, min_width=name_w)
    s.add_column(sim_report.HEADER[-2], overflow="fold")
    for row in rows:
        s.add_row(row[0], row[len(heads)])
    return [t, s]


def run(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tidal.cli import render, sim_report

    names = parse_systems(args.systems)
    if args.gantt_system is not None and args.gantt_system not in names:  # checked before minutes of simulation
        raise TidalError(f"--gantt-system {args.gantt_system!r} is not among --systems ({', '.join(names)})")
    if args.json is not None and not args.json.parent.is_dir():
        raise TidalError(f"--json {args.json}: directory {args.json.parent} does not exist")
    if args.report is not None and args.report.exists() and not args.report.is_dir():
        raise TidalError(f"--report {args.report} is a file, not a directory")
    sim = SimConfig(schedule=args.schedule, fwd_share=args.fwd_share, overlap_sync=not args.no_overlap)
    w = workload_of(args)
    runs: list[SystemRun] = []
    t0, c0 = time.perf_counter(), time.thread_time()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=render.console(stderr=True), transient=True, disable=args.quiet)
    errors: dict[str, str] = {}
    with bar:
        for name in names:
            task = bar.add_task(f"{name:<10}", total=args.steps)
            try:
                runs.append(run_system(name, w, sim, lambda task=task: bar.advance(task)))
            except TidalError as e:  # one system that cannot run this workload does not stop the others
                errors[name] = str(e)
    if not runs:
        raise TidalError("no system could run: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    sp = speedups(runs)
    con = render.console()
    for t in sim_tables(runs, sp, f"simulate: {args.model} on {args.cluster}, {args.data}, max-len "
                        f"{args.max_len}, {args.tokens_per_step:,} tokens/step, {args.schedule}", con.width):
        con.print(t)
    for r in runs:
        con.print(f"[bold]{r.name}[/bold] config (candidates): {r.config}", soft_wrap=False, overflow="fold")
    for k, v in errors.items():
        con.print(f"[bold red]{k}[/bold red] cannot run this workload: {v}")
    con.print(f"planned with {args.cost_model or 'analytic'}; executed on "
              f"{args.truth + ' (truth unseen by the planners)' if args.truth else 'the same model'}")
    con.print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (planning and simulation of {len(runs)} systems)")
    meta = {"model": args.model, "cluster": args.cluster, "data": args.data, "max_len": args.max_len,
            "tokens_per_step": args.tokens_per_step, "steps": args.steps, "seed": args.seed,
            "schedule": args.schedule, "fwd_share": args.fwd_share, "overlap_sync": not args.no_overlap,
            "cost_model": str(args.cost_model or "analytic"), "truth": str(args.truth or "as planned"),
            "config": str(args.config) if args.config else None}
    if args.json:
        try:
            args.json.write_text(json.dumps(to_json(runs, meta, errors), indent=1))
        except OSError as e:
            raise TidalError(f"cannot write {args.json}: {e.strerror}") from None
        print(f"results written to {args.json}", file=sys.stderr)
    if args.report:
        title = (f"tidal simulate: {args.model} on {args.cluster}, {args.data}, max-len {args.max_len}, "
                 f"{args.tokens_per_step:,} tokens/step, {args.steps} steps")
        sim_report.write_report(args.report, runs, sp, title, args.gantt_system, args.gantt_step)
        print(f"report written to {args.report / 'index.html'}", file=sys.stderr)
    return 0
