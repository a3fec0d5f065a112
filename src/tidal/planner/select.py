"""Per-step strategy selection: two-stage assignment (dispatch, then packing) on every candidate, keep the fastest.

Candidates are visited in order of their step lower bound and skipped once the bound cannot beat the incumbent, so the
answer equals the exhaustive minimum over candidates (ties go to the lower candidate index) at a fraction of the cost.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.planner.alg1 import dispatch_hydraulis
from tidal.planner.bounds import StrategyBound, check_lengths, prepare_lengths
from tidal.planner.charges import charge
from tidal.planner.config import DEFAULT, PlannerConfig
from tidal.planner.dispatch import dispatch, dispatch_alternatives, length_orders
from tidal.planner.metrics import max_over_mean, rank_spread
from tidal.planner.packing import Packer, pack
from tidal.planner.passes import Allowance, Context, by_load, flatten, improve, pack_groups
from tidal.planner.pipecost import pipe_coeffs
from tidal.planner.profiles import StrategyProfile as StrategyProfile  # callers import both from here
from tidal.planner.profiles import profile_strategies as profile_strategies


@dataclass(frozen=True)
class PipelineReport:
    scheme: str
    sequences: int
    tokens: int
    micro_batches: int
    est_time: float  # s
    mb_imbalance: float  # max/mean micro-batch time (WLB-LLM)


@dataclass(frozen=True)
class StrategyReport:
    index: int
    name: str
    lower_bound: float  # inf when infeasible (a sequence longer than every MaxLen)
    est_step_time: float | None  # None when infeasible or pruned by its bound


@dataclass(frozen=True)
class StepSelection:
    plan: StepPlan
    strategies: tuple[StrategyReport, ...]
    pipelines: tuple[PipelineReport, ...]  # of the chosen strategy
    rank_spread: float  # (max - min) / max of pipeline times (Hydraulis Fig. 15b)
    pipeline_imbalance: float  # max / mean of pipeline times
    cut_short: bool = False  # the time budget ended the search early (the plan is valid, its bound still proven)


def _reports(l_: np.ndarray, prof: StrategyProfile, plans) -> list[PipelineReport]:
    """Per-pipeline reports of a plan: each document's work computed once with its pipeline's coefficients, each
    pipeline's tokens and micro-batch imbalance in one compiled call (kernels_sums.pipe_reports), the same floats as
    reporting pipeline by pipeline (decision 112)."""
    from tidal.planner import kernels_sums

    flat, mb_of, n_mb = flatten([mb for pp_ in plans for mb in pp_.micro_batches])
    sub = l_[flat]
    docs = np.array([sum(len(mb) for mb in pp_.micro_batches) for pp_ in plans], dtype=np.int64)
    mbs = np.array([len(pp_.micro_batches) for pp_ in plans], dtype=np.int64)
    doc_end, mb_end = np.cumsum(docs), np.cumsum(mbs)
    pipe_of = np.repeat(np.arange(len(plans)), docs)
    a, b, c, d = pipe_coeffs(prof.pipes)
    lf = sub.astype(np.float64)
    wdoc = a[pipe_of] * lf * lf + b[pipe_of] * lf + d[pipe_of]  # PipeCost.work, per document
    mb_work = np.bincount(mb_of, weights=wdoc, minlength=n_mb)
    tok, imb, bad = kernels_sums.loops().pipe_reports(sub, mb_work, doc_end, mb_end, c)
    if bad:
        raise TidalError("metrics need finite, non-negative values")
    de, me = [0] + doc_end.tolist(), [0] + mb_end.tolist()
    return [PipelineReport(prof.strategy.pipelines[j].scheme.short(), de[j + 1] - de[j], t, me[j + 1] - me[j],
                           pp_.est_time, im) for j, (pp_, t, im) in enumerate(zip(plans, tok.tolist(), imb.tolist()))]


def assign(lengths: np.ndarray, prof: StrategyProfile, *, packer: Packer = pack, seed: int = 0,
           exact: bool = False, target: float = 0.0, deadline: float | None = None,
           fallback: bool = True, improve_below: float = float("inf"), allowance: Allowance | None = None,
           config: PlannerConfig = DEFAULT, orders: tuple | None = None) -> tuple[float, tuple[PipelinePlan, ...]]:
    """Two-stage assignment on one strategy: (step estimate, per-pipeline plans), as docs/planner.md, "The pipeline,
    in one list", orders it: the first dispatch and its alternatives packed, the fastest kept; the passes of
    `config.passes` (passes.improve) against `target` (a lower bound) while the candidate can beat `improve_below`,
    the `deadline` (perf_counter) and `allowance` allow; with `fallback`, Hydraulis' dispatch + the same packer when
    faster ("Never worse than Hydraulis").
    `orders`: dispatch.length_orders(lengths), when the caller has them (select_step sorts them once per step)."""
    cfg = config
    l_ = np.asarray(lengths, dtype=np.int64)
    if exact:
        disp = dispatch(l_, prof.pipes, exact=True, seed=seed, target=target, deadline=deadline, config=cfg)
        est, plans = pack_groups(l_, prof, disp.groups, packer, exact)
    else:
        # the dispatch objective is a bound on the packed time: a restart that lowers it can pack worse, so the first
        # dispatch and each alternative (best restart, jump-scan greedy) are packed and the fastest kept (ties to the
        # earliest)
        orders = length_orders(l_) if orders is None else orders
        first, alts = dispatch_alternatives(l_, prof.pipes, seed=seed, target=target, deadline=deadline,
                                            scan=cfg.scan, config=cfg, orders=orders)
        est, plans = pack_groups(l_, prof, first.groups, packer, exact)
        for alt in alts:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            est2, plans2 = pack_groups(l_, prof, alt.groups, packer, exact, limit=est, order=by_load(alt))
            if est2 < est:
                est, plans = est2, plans2
        if cfg.passes:
            ctx = Context(l_, prof, packer, seed, target, deadline, cfg, first.objective, orders)
            est, plans = improve(ctx, est, plans, Allowance() if allowance is None else allowance, improve_below)
    if fallback and est > target and (deadline is None or time.perf_counter() < deadline):
        return _hydraulis_plan(l_, prof, packer, seed, exact, est, cfg) or (est, plans)
    return est, plans


def _hydraulis_plan(l_: np.ndarray, prof: StrategyProfile, packer: Packer, seed: int, exact: bool,
                    limit: float, cfg: PlannerConfig) -> tuple[float, tuple[PipelinePlan, ...]] | None:
    """Hydraulis' dispatch followed by `packer`, if it beats `limit` (packed only when its dispatch cost, a lower
    bound on its packed time, is below `limit`)."""
    hy = dispatch_hydraulis(l_, prof.pipes, trials=cfg.hydraulis_trials, seed=seed)
    if hy.objective < limit:
        est, plans = pack_groups(l_, prof, hy.groups, packer, exact)
        if est < limit:
            return est, plans
    return None


def select_step(lengths, profiles: Sequence[StrategyProfile], *, packer: Packer = pack, seed: int = 0,
                exact: bool = False, seq_ids: Sequence[int] | None = None, prune: bool = True,
                budget_ms: float | None = None, tol: float = 1e-3, config: PlannerConfig = DEFAULT) -> StepSelection:
    """Plan one step: the candidate (index into `profiles`) with the least estimated step time, plus reports
    (docs/planner.md, "Per-step selection"). `tol`: a candidate (or Hydraulis' dispatch on it) is skipped when its
    bound is within a factor 1 + tol of the incumbent (0: the exact best, ties to the lower index); `budget_ms`: past
    it, the best plan so far with `cut_short` set ("Time budget"). The reported bound is the least refined bound of the
    candidates that could have won; the proofs (`tidal.proof`) raise it after planning."""
    t0 = time.perf_counter()
    cfg = config
    deadline = None if budget_ms is None else t0 + budget_ms / 1e3
    l_ = check_lengths(lengths)
    if not profiles:
        raise TidalError("no candidate strategy to plan with")
    ids = tuple(range(l_.size)) if seq_ids is None else tuple(int(x) for x in seq_ids)
    if len(ids) != l_.size:
        raise TidalError(f"seq_ids has {len(ids)} entries for {l_.size} sequences")
    names = [str(p.strategy) for p in profiles]
    if l_.size == 0:
        plans = pack_groups(l_, profiles[0], [()] * len(profiles[0].pipes), packer, exact)[1]  # every pipeline empty
        plan = StepPlan(ids, (), 0, plans, (), 0.0, 0.0, (time.perf_counter() - t0) * 1e3)
        reps = tuple(StrategyReport(k, names[k], 0.0, 0.0 if k == 0 else None) for k in range(len(profiles)))
        return StepSelection(plan, reps, (), 0.0, 1.0)
    longest = int(l_.max())
    # quick bounds (doc + work with fixed prices) order and prune the candidates; refined ones give the reported bound
    prep = prepare_lengths(l_)  # shared by every candidate's bounds
    orders = length_orders(l_)  # and the documents' length orders by every candidate's dispatches
    sbs = [StrategyBound(l_, p.pipes, arrays=p.class_arrays, prep=prep)
           if longest <= p.max_len else None for p in profiles]
    # a charged candidate (charges.charge: pull/push, CP imbalance) adds at least its floor to its bounds
    off = [0.0 if p.charges is None else p.charges.floor for p in profiles]
    bounds = [float("inf") if sb is None else sb.quick + off[k] for k, sb in enumerate(sbs)]
    refined = [False] * len(profiles)

    def refine(i: int) -> None:
        if not refined[i]:
            sb = sbs[i]
            assert sb is not None
            bounds[i] = max(bounds[i], sb.refined() + off[i])
            refined[i] = True

    def charged(k: int, res):
        if res is None or profiles[k].charges is None:
            return res
        return charge(l_, profiles[k].pipes, profiles[k].charges, res[1])
    if all(b == float("inf") for b in bounds):
        top = max(p.max_len for p in profiles)
        raise TidalError(f"a sequence of {longest} tokens exceeds the MaxLen of every candidate strategy (largest "
                         f"{top}); split or truncate long documents before planning")
    ests: list[float | None] = [None] * len(profiles)
    best: tuple[float, int, tuple[PipelinePlan, ...]] | None = None
    allowance = Allowance.for_step(cfg)  # the passes' costly attempts left for this step (passes.Allowance)
    cut = False
    # Best-first over candidates with lazy refinement: a candidate is assigned only once it has the least refined
    # bound among those left, so candidates whose quick bound is loose do not get assigned early.
    heap = [(bounds[k], k) for k in range(len(profiles)) if bounds[k] != float("inf")]
    heapq.heapify(heap)
    while heap:
        _, k = heapq.heappop(heap)
        if deadline is not None and best is not None and time.perf_counter() > deadline:
            cut = True
            break
        if prune and best is not None and (bounds[k] * (1 + tol), k) >= (best[0], best[1]):
            continue
        if not refined[k] and (deadline is None or time.perf_counter() <= deadline):
            refine(k)
            heapq.heappush(heap, (bounds[k], k))
            continue
        est, plans = charged(k, assign(l_, profiles[k], packer=packer, seed=seed, exact=exact,
                                       target=bounds[k] - off[k], deadline=deadline, fallback=False,
                                       improve_below=float("inf") if best is None else best[0] / (1 + tol) - off[k],
                                       allowance=allowance, config=cfg, orders=orders))
        ests[k] = est
        if best is None or (est, k) < (best[0], best[1]):
            best = (est, k, plans)
    assert best is not None
    # Never worse than Hydraulis' dispatch + the same packer on any candidate: its packed time is >= the candidate's
    # bound, so only candidates whose (refined) bound is below the best estimate need it (same set with or without
    # pruning). Index order and strict improvement keep the answer deterministic.
    for k in range(len(profiles)):
        if bounds[k] == float("inf") or (deadline is not None and time.perf_counter() > deadline):
            cut = cut or bounds[k] != float("inf")
            continue
        if bounds[k] * (1 + tol) >= best[0]:  # the quick bound already rules it out (refining only raises it)
            continue
        refine(k)
        if bounds[k] * (1 + tol) >= best[0]:
            continue
        hy = charged(k, _hydraulis_plan(l_, profiles[k], packer, seed, exact, best[0] - off[k], cfg))
        if hy is not None and hy[0] < best[0]:
            ests[k] = hy[0] if ests[k] is None else min(ests[k], hy[0])
            best = (hy[0], k, hy[1])
    est, k, plans = best
    lb = float("inf")
    for i in sorted(range(len(profiles)), key=lambda i: (bounds[i], i)):
        if bounds[i] >= lb:
            break
        if deadline is not None and time.perf_counter() > deadline:
            cut = True  # the quick bound is valid, only looser
        else:
            refine(i)
        lb = min(lb, bounds[i])
    prof = profiles[k]
    reports = _reports(l_, prof, plans)
    times = [p.est_time for p in plans]
    plan = StepPlan(ids, tuple(l_.tolist()), k, plans, (), float(est), float(lb),
                    (time.perf_counter() - t0) * 1e3)
    strat = tuple(StrategyReport(i, names[i], bounds[i], ests[i]) for i in range(len(profiles)))
    return StepSelection(plan, strat, tuple(reports), rank_spread(times), max_over_mean(times), cut)

