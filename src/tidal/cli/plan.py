"""`tidal plan`: sample steps from a length source and plan each one (strategy, dispatch, packing, CP sharding)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from tidal.core.cluster import get_cluster
from tidal.core.errors import TidalError
from tidal.core.model import get_model
from tidal.core.plan import Plan, StepPlan
from tidal.core.scheme import parse_strategies
from tidal.core.strategy import Strategy, place
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import CostModel, pipeline_device
from tidal.costmodel.fitted import load_cost_model
from tidal.costmodel.kernel import kernel_for
from tidal.data.sampler import LONG_DOC_POLICIES, TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.planner import packing, wlb
from tidal.planner.cp_adaptive import choose_for_micro_batches
from tidal.planner.proposal import propose
from tidal.planner.select import StepSelection, profile_strategies, select_step

PACKERS = {"hydraulis": packing.pack, "wlb": wlb.pack, "fixed": packing.pack_fixed}
PROPOSAL_SAMPLE = 20000  # documents read from the source to propose candidates


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan steps: strategy per step, dispatch, packing, CP sharding, lower bound",
                       description=__doc__)
    p.add_argument("--model", default="llama2-7b", help="model preset (tiny, small, llama2-7b, llama-32b, ...)")
    p.add_argument("--cluster", default="a800x64", help="cluster, TYPExN[+TYPExM] e.g. a800x64, h800x16+h20x32")
    p.add_argument("--data", default="synthetic:commoncrawl",
                   help="synthetic:commoncrawl|github|flanv2 or lengths:FILE (.npy or one integer per line)")
    p.add_argument("--max-len", type=_positive, default=32768, help="context length: longest sequence in a step")
    p.add_argument("--long-docs", choices=LONG_DOC_POLICIES, default="split",
                   help="documents above --max-len: split into chunks (default), truncate, or error")
    p.add_argument("--tokens-per-step", type=_positive, default=200_000)
    p.add_argument("--steps", type=_positive, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategies", default="auto",
                   help="'auto' (proposal DP) or strategies separated by ';', e.g. 'tp4+tp2pp2+2*tp1pp2;8*tp1'")
    p.add_argument("--packing", choices=tuple(PACKERS), default="hydraulis",
                   help="hydraulis: min max micro-batch x (PP-1+V); wlb: WLB-LLM with outlier delay; "
                        "fixed: token-count first-fit (baseline)")
    p.add_argument("--cp-sharding", choices=("adaptive", "per-seq", "per-doc"), default="adaptive")
    p.add_argument("--exact", action="store_true", help="exact MILP dispatch and packing (small instances only)")
    p.add_argument("--plan-budget-ms", type=float, default=2000.0,
                   help="per-step planning budget: past it the best plan so far is returned (valid, gap reported)")
    p.add_argument("--cost-model", type=Path, default=None,
                   help="fitted cost model (.json) or profile (.csv); default: analytic from the specs")
    p.add_argument("--json", type=Path, default=None, help="write the plan JSON here (docs/plan-format.md)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class PlanRun:
    plan: Plan
    selections: tuple[StepSelection | None, ...]  # None for steps with nothing to run now
    token_delays: tuple[float, ...]  # per step: mean delay in steps of the tokens run that step (WLB)
    long_doc_stats: dict


def build_candidates(args, cm: CostModel) -> tuple[Strategy, ...]:
    model, cluster = cm.model, cm.cluster
    if args.strategies.strip().lower() == "auto":
        src = length_source(args.data, args.seed)
        n = PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE)
        sample = np.minimum(src.lengths(0, n), args.max_len)
        prop = propose(sample, cm, tokens_per_step=args.tokens_per_step, max_len=args.max_len, seed=args.seed)
        cands = prop.strategies
    else:
        cands = tuple(place(s, cluster, model) for s in parse_strategies(args.strategies))
    best = max((cm.max_len(p.scheme, pipeline_device(cluster, p)), str(p.scheme)) for s in cands for p in s.pipelines)
    if best[0] < args.max_len:
        raise TidalError(f"--max-len {args.max_len} exceeds the MaxLen of every scheme (largest {best[0]} for "
                         f"{best[1]}); lower --max-len or add a scheme with more TP/CP")
    return cands


def _with_cp_sharding(step: StepPlan, cm: CostModel, policy: str) -> StepPlan:
    pipes = []
    for p in step.pipelines:
        if p.cp > 1 and p.micro_batches:
            layers = max(p.layer_split) if p.layer_split else cm.model.layers
            dev = cm.cluster.device_type(p.devices[0])
            kern = kernel_for(cm.model, tp=p.tp, layers=layers, peak=dev.peak_flops * 0.6, passes=3.0)
            p = replace(p, cp_sharding=choose_for_micro_batches(step.seq_lengths, p.micro_batches, p.cp, kern, policy))
        pipes.append(p)
    return replace(step, pipelines=tuple(pipes))


def _embed(sel: StepPlan, now: list[int], ids: tuple[int, ...], lens: tuple[int, ...], deferred: tuple[int, ...],
           extra_ms: float) -> StepPlan:
    """Re-index a plan of the `now` subset onto the step's full incoming list (which includes deferred ones)."""
    pipes = tuple(replace(p, micro_batches=tuple(tuple(now[i] for i in mb) for mb in p.micro_batches))
                  for p in sel.pipelines)
    return replace(sel, seq_ids=ids, seq_lengths=lens, pipelines=pipes, deferred=deferred,
                   plan_ms=sel.plan_ms + extra_ms)


def plan_run(args, progress=None) -> PlanRun:
    model, cluster = get_model(args.model), get_cluster(args.cluster)
    cm: CostModel = (load_cost_model(args.cost_model, model, cluster) if args.cost_model
                     else AnalyticCostModel(model, cluster))
    candidates = build_candidates(args, cm)
    profiles = profile_strategies(candidates, cm)
    packer = PACKERS[args.packing]
    sampler = TokenBudgetSampler(length_source(args.data, args.seed), args.tokens_per_step, args.max_len,
                                 long_docs=args.long_docs, seed=args.seed)
    wcfg = wstate = None
    if args.packing == "wlb":
        # WLB's N: micro-batch slots per step. A pipeline needs >= PP micro-batches to fill, so N = sum of PP degrees
        # over the first (best expected) candidate; for one homogeneous pipeline this is the paper's PP x DP.
        n_slots = sum(p.scheme.pp for p in candidates[0].pipelines)
        wcfg = wlb.WLBConfig(n_micro=n_slots, max_len=max(args.max_len, math.ceil(2 * args.tokens_per_step / n_slots)),
                             coeffs=profiles[0].pipes[0].coeffs, thresholds=wlb.default_thresholds(args.max_len))
        wstate = wlb.WLBState()
    steps, sels, delays = [], [], []

    def plan_one(ids, lens, now, deferred, t0, waited=None):
        arr = np.asarray(lens, dtype=np.int64)
        if now:
            sel = select_step(arr[now], profiles, packer=packer, seed=args.seed + len(steps), exact=args.exact,
                              seq_ids=[ids[i] for i in now], budget_ms=getattr(args, "plan_budget_ms", None))
            step = _embed(sel.plan, now, ids, lens, deferred, 0.0)
        else:
            sel, step = None, StepPlan(ids, lens, 0, (), deferred, 0.0, 0.0)
        step = _with_cp_sharding(step, cm, args.cp_sharding)
        step = replace(step, plan_ms=(time.perf_counter() - t0) * 1e3)
        steps.append(step)
        sels.append(sel)
        w = arr[now]
        delays.append(float(np.sum(w * np.asarray(waited)[now]) / w.sum()) if waited is not None and now else 0.0)
        if progress is not None:
            progress(step, sel)

    for st in sampler.steps(args.steps):
        t0 = time.perf_counter()
        if wcfg is None:
            plan_one(st.seq_ids, st.lengths, list(range(len(st.lengths))), (), t0)
        else:
            res, wstate = wlb.wlb_step(wstate, st.seq_ids, st.lengths, wcfg)
            plan_one(res.seq_ids, res.seq_lengths, sorted(res.packed), res.deferred, t0,
                     [res.step - a for a in res.arrival])
    if wcfg is not None and not wstate.empty:
        flushed, wstate = wlb.wlb_flush(wstate, wcfg)
        for res in flushed:
            t0 = time.perf_counter()
            plan_one(res.seq_ids, res.seq_lengths, sorted(res.packed), res.deferred, t0,
                     [res.step - a for a in res.arrival])
    if not steps:
        raise TidalError(f"data source {args.data} produced no step")
    meta = {"seed": args.seed, "data": args.data, "max_len": args.max_len, "tokens_per_step": args.tokens_per_step,
            "packing": args.packing, "cp_sharding": args.cp_sharding, "exact": args.exact,
            "long_docs": args.long_docs, "cost_model": str(args.cost_model) if args.cost_model else "analytic"}
    plan = Plan(model.name, cluster.name, tuple(str(s) for s in candidates), tuple(steps), meta)
    return PlanRun(plan, tuple(sels), tuple(delays), asdict(sampler.state.stats))


def run(args) -> int:
    from tidal.cli import render

    console = render.console(stderr=False)
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
