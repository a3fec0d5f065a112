"""`tidal plan`: sample steps from a length source and plan each one (strategy, dispatch, packing, CP sharding)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

from tidal.baselines.packings import PACKINGS
from tidal.cli import args as argtypes
from tidal.cli.dryrun import DEFAULT_STEPS, resolve
from tidal.core.cluster import get_cluster
from tidal.core.errors import TidalError
from tidal.core.model import get_model
from tidal.core.plan import Plan
from tidal.core.strategy import Strategy
from tidal.costmodel.analytic import AnalyticCostModel, analytic_v1, named_efficiency
from tidal.costmodel.base import CostModel
from tidal.costmodel.loader import load_cost_model
from tidal.costmodel.sync import SyncPricing
from tidal.data.sampler import LONG_DOC_POLICIES, TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.planner.select import StepSelection
from tidal.planner.stepper import CP_SHARDINGS, PlanningOptions, StepPlanner, build_candidates
from tidal.proof.lp import prove_selection

PROPOSAL_SAMPLE = 20000  # documents read from the source to propose candidates




def add_workload_args(p) -> None:
    """The model, cluster and data flags `tidal plan` and `tidal simulate` share, and `--config` (a training TOML
    whose job is dry-run; cli/dryrun.py) with its `--SECTION.KEY` overrides."""
    from tidal.cli.configargs import add_override_args

    p.add_argument("--config", type=Path, default=None,
                   help="dry-run this training TOML: model, cluster, data, max_len, tokens_per_step and planner "
                        "settings from the file (and --SECTION.KEY overrides), as `tidal train` would plan them")
    p.add_argument("--model", default=None, help="model preset (tiny, small, llama2-7b, llama-32b, ...); default "
                                                 "llama2-7b")
    p.add_argument("--cluster", default=None,
                   help="cluster, TYPExN[+TYPExM] e.g. a800x64, h800x16+h20x32; default a800x64")
    p.add_argument("--data", default=None,
                   help="synthetic:commoncrawl|github|flanv2|wlb-llm or lengths:FILE (.npy or one integer per line); "
                        "default synthetic:commoncrawl")
    p.add_argument("--max-len", type=argtypes.max_len, default=None,
                   help="context length: longest sequence in a step; default 32768")
    p.add_argument("--long-docs", choices=LONG_DOC_POLICIES, default=None,
                   help="documents above --max-len: split into chunks (default), truncate, or error")
    p.add_argument("--tokens-per-step", type=argtypes.tokens_per_step, default=None,
                   help="tokens per step (global batch); default 200000")
    p.add_argument("--steps", type=argtypes.positive, default=None,
                   help=f"steps to plan; default {DEFAULT_STEPS}, or [train] steps with --config")
    p.add_argument("--seed", type=argtypes.seed, default=None, help="data seed; default 0")
    add_override_args(p)


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan steps: strategy per step, dispatch, packing, CP sharding, lower bound",
                       description=__doc__,
                       usage="tidal plan [--config FILE [--SECTION.KEY VALUE ...]] [options]")
    add_workload_args(p)
    p.add_argument("--strategies", default=None,
                   help="'auto' (proposal DP; the default) or strategies separated by ';', e.g. "
                        "'tp4+tp2pp2+2*tp1pp2;8*tp1'")
    p.add_argument("--packing", choices=tuple(PACKINGS), default=None,
                   help="hydraulis (the default): min max micro-batch x (PP-1+V); wlb: WLB-LLM with outlier delay; "
                        "fixed: token-count first-fit (baseline)")
    p.add_argument("--cp-sharding", choices=CP_SHARDINGS, default=None,
                   help="how CP pipelines split documents over their ranks; default adaptive")
    p.add_argument("--exact", action="store_true", help="exact MILP dispatch and packing (small instances only)")
    p.add_argument("--no-charges", action="store_true",
                   help="plan without charging the gradient pull/push and CP kernel imbalance (the ablation; by "
                        "default they are charged as `tidal simulate` executes them, decision 98)")
    p.add_argument("--no-refine", action="store_true",
                   help="--strategies auto: the plain proposal, without the local search on its sampled estimate that "
                        "the simulator's tidal system runs (faster to propose; decisions 99, 101)")
    p.add_argument("--plan-budget-ms", type=argtypes.finite_float(0.0), default=None,
                   help="per-step planning budget: past it the best plan so far is returned (valid, gap reported); "
                        "default 2000, or none (the training job's) with --config")
    p.add_argument("--cost-model", type=Path, default=None,
                   help="fitted cost model (.json), profile (.csv), Hydraulis strategy pool (.json), or analytic-eager "
                        "(priced for Tidal's own runtime on Hopper); default: analytic from the specs")
    p.add_argument("--prove-bound", action="store_true",
                   help="raise each step's lower bound with LP-priced certificates after planning (tidal.proof.lp; the "
                        "plan is unchanged; up to ~50 ms median more per step, not in the per-step plan time)")
    p.add_argument("--json", type=Path, default=None, help="write the plan JSON here (docs/plan-format.md)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class PlanRun:
    plan: Plan
    selections: tuple[StepSelection | None, ...]  # None for steps with nothing to run now
    token_delays: tuple[float, ...]  # per step: mean delay in steps of the tokens run that step (WLB)
    long_doc_stats: dict


def cost_model_from(spec, model, cluster) -> CostModel:
    """A cost-model spec as `--cost-model` and `--truth` take it: 'analytic' (or None; calibrated, decision 76),
    'analytic-v1' (before it), 'analytic-eager' (priced for Tidal's own runtime, fitted on one H200; decision 116), a
    fitted model JSON, a profile CSV, or a Hydraulis strategy pool JSON as published (docs/costmodel.md)."""
    name = "" if spec is None else str(spec)
    if name.strip().lower() == "analytic-v1":
        return analytic_v1(model, cluster)
    eff = named_efficiency(name)
    return load_cost_model(spec, model, cluster) if eff is None else AnalyticCostModel(model, cluster, eff)


def cost_model_of(args) -> CostModel:
    return cost_model_from(args.cost_model, get_model(args.model), get_cluster(args.cluster))


def charges_of(args) -> tuple[SyncPricing | None, str | None]:
    """(pull/push pricing, CP policy) the plan charges: the simulator's (`SimConfig().sync`, `--cp-sharding`), or
    neither with `--no-charges` (decision 98)."""
    if getattr(args, "no_charges", False):
        return None, None
    return SyncPricing(), args.cp_sharding


def candidates_of(args, cm: CostModel) -> tuple[Strategy, ...]:
    """`--strategies`: 'auto' proposes from the first PROPOSAL_SAMPLE documents of `--data`."""
    sample = None
    if args.strategies.strip().lower() == "auto":
        src = length_source(args.data, args.seed)
        sample = src.lengths(0, PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE))
    sync, policy = charges_of(args)
    return build_candidates(cm, args.strategies, sample, tokens_per_step=args.tokens_per_step,
                            max_len=args.max_len, seed=args.seed, sync=sync, cp_policy=policy,
                            refine=not getattr(args, "no_refine", False))


def plan_run(args, progress=None) -> PlanRun:
    """Plan `args.steps` steps of the workload the flags describe, or of the training job of `args.config`."""
    job = resolve(args)
    if job is None:
        cm = cost_model_of(args)
        candidates = candidates_of(args, cm)
        options = PlanningOptions(max_len=args.max_len, tokens_per_step=args.tokens_per_step, packing=args.packing,
                                  cp_sharding=args.cp_sharding, exact=args.exact, seed=args.seed,
                                  budget_ms=args.plan_budget_ms)
        sampler = TokenBudgetSampler(length_source(args.data, args.seed), args.tokens_per_step, args.max_len,
                                     long_docs=args.long_docs, seed=args.seed)
        sync, policy = charges_of(args)
        charge_cp = policy is not None
    else:
        cm, candidates, options, sampler = job.cost_model, job.candidates, job.options, job.sampler()
        sync, charge_cp = job.sync, job.charge_cp
    planner = StepPlanner(cm, candidates, sampler, options, sync=sync, charge_cp=charge_cp, packings=PACKINGS)
    planned = []
    for ps in chain(planner.steps(args.steps), planner.flush()):
        if args.prove_bound and ps.selection is not None:
            sel = prove_selection(ps.selection.plan.seq_lengths, planner.profiles, ps.selection)
            ps = replace(ps, selection=sel, plan=replace(ps.plan, lower_bound=sel.plan.lower_bound))
        planned.append(ps)
        if progress is not None:
            progress(ps.plan, ps.selection)
    if not planned:
        raise TidalError(f"data source {args.data} produced no step")
    meta = {"seed": args.seed, "data": args.data, "max_len": args.max_len, "tokens_per_step": args.tokens_per_step,
            "packing": args.packing, "cp_sharding": args.cp_sharding, "exact": args.exact,
            "prove_bound": args.prove_bound, "charges": sync is not None or charge_cp, "refine": not args.no_refine,
            "long_docs": args.long_docs, "cost_model": str(args.cost_model) if args.cost_model else "analytic"}
    if args.config:
        meta["config"] = str(args.config)
    plan = Plan(cm.model.name, cm.cluster.name, tuple(str(s) for s in candidates), tuple(p.plan for p in planned),
                meta)
    return PlanRun(plan, tuple(p.selection for p in planned), tuple(p.token_delay for p in planned),
                   planner.long_doc_stats)


def run(args) -> int:
    from tidal.cli import render

    if args.json is not None and not args.json.parent.is_dir():  # before planning, not after
        raise TidalError(f"--json {args.json}: directory {args.json.parent} does not exist")
    console = render.console(stderr=False)
    resolve(args)  # the steps to plan are known after this (with --config: [train] steps)
    with render.progress(args.steps, quiet=args.quiet) as advance:
        def on_step(step, sel):
            advance()
            if not args.quiet:
                render.step_table(console, len(out_steps), step, sel)
            out_steps.append(step)

        out_steps: list = []
        result = plan_run(args, progress=on_step)
    render.summary(console, result)
    if args.json:
        try:
            args.json.write_text(result.plan.to_json())
        except OSError as e:
            raise TidalError(f"cannot write {args.json}: {e.strerror}") from None
        print(f"plan written to {args.json}", file=sys.stderr)
    return 0
