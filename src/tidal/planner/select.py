"""Per-step strategy selection: two-stage assignment (dispatch, then packing) on every candidate, keep the fastest.

Candidates are visited in order of their step lower bound and skipped once the bound cannot beat the incumbent, so the
answer equals the exhaustive minimum over candidates (ties go to the lower candidate index) at a fraction of the cost.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.planner.baselines.hydraulis import dispatch_hydraulis
from tidal.planner.bounds import PipeCost, StrategyBound, check_lengths, pipeline_bound, prepare_lengths
from tidal.planner.bounds_modes import mode_bound
from tidal.planner.charges import charge
from tidal.planner.classfill import class_plan, pick_class
from tidal.planner.config import DEFAULT, PlannerConfig
from tidal.planner.dispatch import dispatch, dispatch_alternatives, restart_dispatch
from tidal.planner.fill import fill_dispatch, worth_filling
from tidal.planner.metrics import max_over_mean, mb_imbalance, rank_spread
from tidal.planner.packing import Packer, pack, pipeline_time
from tidal.planner.polish import polish
from tidal.planner.profiles import StrategyProfile as StrategyProfile  # callers import both from here
from tidal.planner.profiles import profile_strategies as profile_strategies


@dataclass(frozen=True)
class PipelineReport:
    pipeline: int
    scheme: str
    sequences: int
    tokens: int
    micro_batches: int
    est_time: float  # s
    lower_bound: float  # s, bounds.pipeline_bound of its sequences
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


def _flatten(mbs) -> tuple[np.ndarray, np.ndarray, int]:
    """(sequence indices of all micro-batches in order, the micro-batch of each, micro-batch count)."""
    sizes = [len(mb) for mb in mbs]
    flat = np.fromiter((i for mb in mbs for i in mb), dtype=np.int64, count=sum(sizes))
    return flat, np.repeat(np.arange(len(sizes)), sizes), len(sizes)


def _mb_times(l_: np.ndarray, mbs, pc: PipeCost) -> np.ndarray:
    """c + sum of w over each micro-batch (for reports: one vectorised pass, not a float-exact pipeline_time)."""
    flat, mb_of, v = _flatten(mbs)
    return pc.c + np.bincount(mb_of, weights=pc.work(l_[flat]), minlength=v)


def _check_packing(mbs, n: int, sub: np.ndarray, max_len: int) -> None:
    """Every one of the packer's n sequences exactly once, no micro-batch over max_len tokens (one-line errors)."""
    flat, mb_of, v = _flatten(mbs)
    if flat.size != n or (n and (flat.min() < 0 or flat.max() >= n or np.bincount(flat, minlength=n).max() != 1)):
        raise TidalError(f"packer returned a packing that does not hold each of its {n} sequences exactly once")
    tokens = np.bincount(mb_of, weights=sub[flat], minlength=v)
    if tokens.size and tokens.max() > max_len:  # token counts < 2^53: the float sums are exact
        raise TidalError(f"packer returned a micro-batch of {int(tokens.max())} tokens > MaxLen {max_len}")


def assign(lengths: np.ndarray, prof: StrategyProfile, *, packer: Packer = pack, seed: int = 0,
           exact: bool = False, target: float = 0.0, deadline: float | None = None,
           fallback: bool = True, shrink_below: float = float("inf"), shrink_left: list[int] | None = None,
           config: PlannerConfig = DEFAULT) -> tuple[float, tuple[PipelinePlan, ...]]:
    """Two-stage assignment on one strategy: (step estimate, per-pipeline plans with step indices). `target` (a
    lower bound) lets the dispatch local search stop once it meets it (nothing better exists); `deadline` (perf_counter)
    cuts the local search short. `config` (config.PlannerConfig) holds every knob named below as c.<knob>. With
    `fallback`, Hydraulis' dispatch (dispatch_hydraulis, c.hydraulis_trials shuffles, `seed`) followed by the same
    packer is also tried when its dispatch cost (a lower bound on its packed time) is below our estimate, and the
    better plan kept: the result is never worse than that baseline (unless the deadline passed before it ran). With
    c.improve (heuristic path only), a packing that overshoots its dispatch because micro-batches could not be
    filled to MaxLen triggers dispatch retries with a smaller effective MaxLen (c.shrink_fracs) if `target` <
    `shrink_below` (select_step passes the incumbent: a candidate whose bound cannot beat it is not retried), each
    retry taking one from `shrink_left[0]` if given (select_step's per-step allowance); the fastest packed plan is
    kept. Before the retry, on steps too large for dispatch_alternatives' restarts (c.restart_max < B x D <=
    c.late_restart_max), a plan above `target` by more than c.late_gap gets c.late_restarts random-order restarts
    (_restart_plan, decision 59; same `shrink_below` gate, `shrink_left[1]` is select_step's allowance of such
    candidates) and the faster plan goes on to the retry; a larger step (up to c.late_restart_max_big) more than
    c.late_gap_big above gets c.late_big_restarts with the dispatch's full local search (decision 65). After the
    retry, a plan still more than c.shrink_done above `target` is polished (polish.polish, c.polish_rounds rounds,
    decision 60). Last, the next-best restarts of a small step (dispatch_alternatives' `extra`, up to
    c.restart_keep - 1) are packed, and polished if one is faster (decision 64). Then, if c.fill and the plan is
    more than c.fill_gap above `target` and has a token-full single-micro-batch pipeline (fill.worth_filling), it is
    re-dispatched with those pipelines filled first (_fill_plan, decision 68; `shrink_left[2]` is select_step's
    allowance). Last, if c.class_fill and still more than c.class_gap above, a class of many-micro-batch PP = 1
    pipelines is filled bin by bin and the others planned apart (_class_plan, decision 69; `shrink_left[3]`).
    c.improve = False turns all six off; the result is never worse than with them off. c.scan: the dispatch
    greedy's jump scan (decision 63). The strategy proposal plans with PlannerConfig.cheap() (both off)."""
    cfg = config
    shrink, scan = cfg.improve, cfg.scan
    l_ = np.asarray(lengths, dtype=np.int64)
    if exact:
        disp = dispatch(l_, prof.pipes, exact=True, seed=seed, target=target, deadline=deadline, config=cfg)
        est, plans = _pack_groups(l_, prof, disp.groups, packer, exact)
    else:
        # the dispatch objective is a bound on the packed time: a restart that lowers it can pack worse, so the first
        # dispatch and each alternative (best restart, jump-scan greedy) are packed and the fastest kept (ties to the
        # earliest)
        extra: list = []  # the next-best restarts, packed last (with `shrink`)
        first, alts = dispatch_alternatives(l_, prof.pipes, seed=seed, target=target, deadline=deadline,
                                            scan=scan, extra=extra if shrink else None,
                                            config=cfg)
        est, plans = _pack_groups(l_, prof, first.groups, packer, exact)
        for alt in alts:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            est2, plans2 = _pack_groups(l_, prof, alt.groups, packer, exact, limit=est, order=_by_load(alt))
            if est2 < est:
                est, plans = est2, plans2
        big = l_.size * len(prof.pipes) > cfg.late_restart_max
        if shrink and target * (1 + (cfg.late_gap_big if big else cfg.late_gap)) < est and target < shrink_below \
                and cfg.restart_max < l_.size * len(prof.pipes) <= cfg.late_restart_max_big \
                and (shrink_left is None or shrink_left[1] > 0) \
                and (deadline is None or time.perf_counter() < deadline):
            if shrink_left is not None:
                shrink_left[1] -= 1
            res = _restart_plan(l_, prof, packer, seed, target, deadline, est,
                                cfg.late_big_restarts if big else cfg.late_restarts, None if big else cfg.late_rounds)
            if res is not None:  # the retry below then starts from it (it is not compared with the first again)
                est, plans = res
        if shrink and target < est and target < shrink_below:
            est, plans = _shrink_retry(l_, prof, packer, seed, target, deadline, est, plans, first.objective,
                                       shrink_left, cfg)
        if cfg.polish_rounds and shrink and target * (1 + cfg.shrink_done) < est and target < shrink_below \
                and (deadline is None or time.perf_counter() < deadline):
            est, plans = polish(l_, prof.pipes, plans, est, target=target, rounds=cfg.polish_rounds,
                                light=cfg.polish_light)
        # the next-best restarts last, so everything above is as without them (decision 64)
        for alt in extra:
            if (deadline is not None and time.perf_counter() >= deadline) or alt.objective >= est:
                continue
            est2, plans2 = _pack_groups(l_, prof, alt.groups, packer, exact, limit=est, order=_by_load(alt))
            if est2 < est:
                est, plans = est2, plans2
                if cfg.polish_rounds and shrink and target * (1 + cfg.shrink_done) < est:
                    est, plans = polish(l_, prof.pipes, plans, est, target=target, rounds=cfg.polish_rounds,
                                        light=cfg.polish_light)
        if cfg.fill and shrink and target > 0 and target * (1 + cfg.fill_gap) < est and target < shrink_below \
                and (shrink_left is None or shrink_left[2] > 0) \
                and (deadline is None or time.perf_counter() < deadline):
            est, plans = _fill_plan(l_, prof, packer, target, est, plans, shrink_left, deadline, cfg)
        if cfg.class_fill and packer is pack and shrink and target > 0 and target * (1 + cfg.class_gap) < est \
                and target < shrink_below and (shrink_left is None or shrink_left[3] > 0) \
                and (deadline is None or time.perf_counter() < deadline):
            est, plans = _class_plan(l_, prof, target, est, plans, shrink_left, deadline, cfg)
    if fallback and est > target and (deadline is None or time.perf_counter() < deadline):
        hy = _hydraulis_plan(l_, prof, packer, seed, exact, est)
        if hy is not None:
            return hy
    return est, plans


def _shrink_retry(l_: np.ndarray, prof: StrategyProfile, packer: Packer, seed: int, target: float,
                  deadline: float | None, est: float, plans: tuple[PipelinePlan, ...],
                  objective: float, left: list[int] | None = None,
                  cfg: PlannerConfig = DEFAULT) -> tuple[float, tuple[PipelinePlan, ...]]:
    """The dispatch charges ceil(tokens / MaxLen) micro-batches; when a pipeline's packing needed more and that set
    the step time above the dispatch objective, dispatch again with that pipeline class's MaxLen scaled down (so it
    is given fewer tokens than it can nominally hold) and pack with the real MaxLen; keep the fastest plan. Every
    packed plan is checked against the real MaxLen, so the result is valid whatever the retries dispatched."""
    pipes = prof.pipes
    over = set()
    for pl, pc in zip(plans, pipes):
        # first, so the token sums run only for these (800 pipelines)
        if pl.est_time > objective * (1 + cfg.shrink_gap):
            tokens = sum(int(l_[list(mb)].sum()) for mb in pl.micro_batches)
            if len(pl.micro_batches) > -(-tokens // pc.max_len):
                over.add(pc)
    if not over:
        return est, plans
    longest = int(l_.max())
    for frac in cfg.shrink_fracs:
        if (deadline is not None and time.perf_counter() > deadline) or (left is not None and left[0] <= 0):
            break
        shrunk = [dataclasses.replace(pc, max_len=max(1, int(pc.max_len * frac))) if pc in over else pc
                  for pc in pipes]
        if longest > max(pc.max_len for pc in shrunk):
            continue
        if left is not None:
            left[0] -= 1
        disp = dispatch(l_, shrunk, seed=seed, restarts=0, target=target, deadline=deadline,
                        max_rounds=cfg.shrink_rounds, config=cfg)
        # packed most-loaded first, given up at the first pipeline that is no faster than the plan it must beat
        est2, plans2 = _pack_groups(l_, prof, disp.groups, packer, False, limit=est, order=_by_load(disp))
        if est2 < est:  # not monotone in the fraction (which documents still fit changes), so all are tried
            est, plans = est2, plans2
            if est <= target * (1 + cfg.shrink_done):
                break
    return est, plans


def _by_load(disp) -> list[int]:
    """Pipeline indices by descending dispatch load (ties by index): _pack_groups' order when it may give up early."""
    return sorted(range(len(disp.loads)), key=lambda j: (-disp.loads[j], j))


def _restart_plan(l_: np.ndarray, prof: StrategyProfile, packer: Packer, seed: int, target: float,
                  deadline: float | None, est: float, restarts: int,
                  rounds: int | None) -> tuple[float, tuple[PipelinePlan, ...]] | None:
    """config.late_restarts random-order restarts (dispatch.restart_dispatch) of a step too large for
    dispatch_alternatives' own, packed (most-loaded pipeline first, given up at the first that reaches `est`) if
    the best restart's dispatch objective, a lower bound on its packed time, is below `est`; the plan if faster
    than `est`, else None. Decision 59."""
    alt = restart_dispatch(l_, prof.pipes, restarts, seed=seed, below=est, target=target, deadline=deadline,
                           max_rounds=rounds)
    if alt is None:
        return None
    est2, plans = _pack_groups(l_, prof, alt.groups, packer, False, limit=est, order=_by_load(alt))
    return (est2, plans) if est2 < est else None


def _fill_plan(l_: np.ndarray, prof: StrategyProfile, packer: Packer, target: float, est: float,
               plans: tuple[PipelinePlan, ...], left: list[int] | None,
               deadline: float | None = None,
               cfg: PlannerConfig = DEFAULT) -> tuple[float, tuple[PipelinePlan, ...]]:
    """The plan re-dispatched with its single-micro-batch pipelines filled first (fill.fill_dispatch, cap `target`
    times 1 + cfg.fill_slack), packed and polished, if faster than `est`; else (est, plans). A re-dispatch takes one
    from `left[2]` (select_step's per-step allowance) if given. Decision 68."""
    cap = target * (1 + cfg.fill_slack)
    if not worth_filling(l_, prof.pipes, plans, cap, est):
        return est, plans
    if left is not None:
        left[2] -= 1
    groups = fill_dispatch(l_, prof.pipes, plans, cap, deadline=deadline)
    if groups is None:
        return est, plans
    est2, plans2 = _pack_groups(l_, prof, groups, packer, False, limit=est)
    if est2 < est and cfg.polish_rounds and target * (1 + cfg.shrink_done) < est2 \
            and (deadline is None or time.perf_counter() < deadline):
        est2, plans2 = polish(l_, prof.pipes, plans2, est2, target=target, rounds=cfg.polish_rounds,
                              light=cfg.polish_light)
    return (est2, plans2) if est2 < est else (est, plans)


def _class_plan(l_: np.ndarray, prof: StrategyProfile, target: float, est: float, plans: tuple[PipelinePlan, ...],
                left: list[int] | None, deadline: float | None,
                cfg: PlannerConfig = DEFAULT) -> tuple[float, tuple[PipelinePlan, ...]]:
    """classfill.class_plan, the other pipelines planned by `assign` (without a class fill of their own); it takes
    one from `left[3]` (select_step's allowance) if given and the plan has such a class. Decision 69."""
    pick = pick_class(prof.pipes, plans, cfg)
    if pick is None:
        return est, plans
    if left is not None:
        left[3] -= 1

    def rest(sub_l: np.ndarray, sub: StrategyProfile, T: float):
        return assign(sub_l, sub, target=T, deadline=deadline, fallback=False,
                      shrink_left=[*cfg.class_rest_left, 0], config=cfg)
    return class_plan(l_, prof, plans, est, target, rest, deadline, pick, cfg)


def _hydraulis_plan(l_: np.ndarray, prof: StrategyProfile, packer: Packer, seed: int, exact: bool,
                    limit: float, cfg: PlannerConfig = DEFAULT) -> tuple[float, tuple[PipelinePlan, ...]] | None:
    """Hydraulis' dispatch followed by `packer`, if it beats `limit` (packed only when its dispatch cost, a lower
    bound on its packed time, is below `limit`)."""
    hy = dispatch_hydraulis(l_, prof.pipes, trials=cfg.hydraulis_trials, seed=seed)
    if hy.objective < limit:
        est, plans = _pack_groups(l_, prof, hy.groups, packer, exact)
        if est < limit:
            return est, plans
    return None


def _pack_groups(lengths: np.ndarray, prof: StrategyProfile, groups, packer: Packer, exact: bool,
                 limit: float = float("inf"), order=None) -> tuple[float, tuple[PipelinePlan, ...]]:
    """Pack every pipeline's group: (step estimate, plans). With a finite `limit`, packing stops at the first pipeline
    whose time reaches it and returns (inf, ()): `order` (pipeline indices, e.g. by descending dispatch load) says
    which are packed first."""
    plans: list = [None] * len(prof.pipes)
    lf = lengths.astype(np.float64)  # once, not per pipeline in pipeline_time
    for j in (range(len(prof.pipes)) if order is None else order):
        pipe, group = prof.pipes[j], groups[j]
        pl = prof.strategy.pipelines[j]
        idx = np.asarray(group, dtype=np.int64)
        if idx.size == 0:
            mbs: tuple[tuple[int, ...], ...] = ()
            est = 0.0
        else:
            sub = lengths[idx]
            est = None
            if packer is pack and pipe.pp == 1 and pipe.c > 0 and not exact and int(sub.sum()) <= pipe.max_len:
                # pack's own answer, without its per-call overhead (hundreds of such pipelines at 1024 GPUs): with
                # PP = 1 and c > 0, one micro-batch (c + W) beats every V >= 2 (>= W + V c), so pack returns it.
                mbs = (tuple(idx.tolist()),)
            else:
                res = packer(sub, pipe.coeffs, pipe.pp, pipe.max_len, exact=exact)
                if packer is not pack:  # pack checks its own (decision 69's review: 0.8 ms per step here)
                    _check_packing(res.micro_batches, idx.size, sub, pipe.max_len)
                gl = idx.tolist()
                mbs = tuple(tuple(gl[i] for i in mb) for mb in res.micro_batches if len(mb))
                if packer is pack:  # its est_time is pipeline_time of these micro-batches (the same floats)
                    est = res.est_time
            if est is None:  # another packer's est_time is not trusted
                est = pipeline_time(lf, mbs, pipe.coeffs, pipe.pp)
        if est >= limit:
            return float("inf"), ()
        plans[j] = PipelinePlan(pl.scheme.tp, pl.scheme.pp, pl.scheme.cp, pl.devices, pipe.max_len, mbs, est,
                                layer_split=prof.layer_splits[j])
    return max((p.est_time for p in plans), default=0.0), tuple(plans)


def select_step(lengths, profiles: Sequence[StrategyProfile], *, packer: Packer = pack, seed: int = 0,
                exact: bool = False, seq_ids: Sequence[int] | None = None, prune: bool = True,
                budget_ms: float | None = None, tol: float = 1e-3, modes: bool = True,
                config: PlannerConfig = DEFAULT) -> StepSelection:
    """Plan one step: the candidate (index into `profiles`) with the least estimated step time, plus reports.
    `tol`: a candidate (or Hydraulis' dispatch on it) is skipped when its proven bound is within a factor 1 + tol of
    the incumbent, so the estimate is within 1 + tol of the best over candidates of min(our assignment, Hydraulis'
    dispatch + the same packer); tol = 0 gives exactly that best (ties to the lower index), pruned or not.
    `budget_ms`: once that much wall time has passed, no further candidate is assigned, the local search stops and the
    bounds are not refined; the best plan so far is returned (always valid; at least one candidate is assigned, by the
    greedy dispatch at worst) with a proven, possibly looser, lower bound, and `cut_short` set. Without a budget, or
    when it is not reached, the result is deterministic. `modes`: raise the reported bound of candidates whose bound is
    more than a factor 1 + config.mode_gap under the chosen estimate with bounds_modes.mode_bound (the plan is
    unchanged). `config`: the planner's knobs (config.PlannerConfig; select_step's per-step allowances come from it)."""
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
        prof = profiles[0]
        plans = tuple(PipelinePlan(pl.scheme.tp, pl.scheme.pp, pl.scheme.cp, pl.devices, pc.max_len, (), 0.0,
                                   layer_split=prof.layer_splits[j])
                      for j, (pl, pc) in enumerate(zip(prof.strategy.pipelines, prof.pipes)))
        plan = StepPlan(ids, (), 0, plans, (), 0.0, 0.0, (time.perf_counter() - t0) * 1e3)
        reps = tuple(StrategyReport(k, names[k], 0.0, 0.0 if k == 0 else None) for k in range(len(profiles)))
        return StepSelection(plan, reps, (), 0.0, 1.0)
    longest = int(l_.max())
    # quick bounds (doc + work with fixed prices) order and prune the candidates; refined ones give the reported bound
    prep = prepare_lengths(l_)  # shared by every candidate's bounds
    sbs = [StrategyBound(l_, p.pipes, grouped=p.grouped, arrays=p.class_arrays, prep=prep)
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
    # retry dispatches (decision 58), candidates with late restarts (decision 59) and fill re-dispatches (decision 68)
    # left for this step
    shrink_left = [cfg.shrink_per_step, cfg.late_per_step, cfg.fill_per_step, cfg.class_per_step]
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
                                       shrink_below=float("inf") if best is None else best[0] / (1 + tol) - off[k],
                                       shrink_left=shrink_left, config=cfg))
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
            cut = True
            lb = min(lb, bounds[i])  # the quick bound is valid, only looser
            continue
        refine(i)
        on_time = deadline is None or time.perf_counter() <= deadline
        if modes and on_time and bounds[i] * (1 + cfg.mode_gap) < min(lb, est):
            # the mode-aware bound (bounds_modes), searched only up to what can still lower the step bound
            sb = sbs[i]
            assert sb is not None
            bounds[i] = max(bounds[i], mode_bound(sb, bounds[i] - off[i], min(lb, est) - off[i]) + off[i])
        lb = min(lb, bounds[i])
    prof = profiles[k]
    reports = []
    for j, (pp_, pc) in enumerate(zip(plans, prof.pipes)):
        idx = [i for mb in pp_.micro_batches for i in mb]
        reports.append(PipelineReport(
            j, prof.strategy.pipelines[j].scheme.short(), len(idx), int(l_[idx].sum()) if idx else 0,
            len(pp_.micro_batches), pp_.est_time, pipeline_bound(l_[idx], pc) if idx else 0.0,
            mb_imbalance(_mb_times(l_, pp_.micro_batches, pc)) if len(pp_.micro_batches) > 1 else 1.0))
    times = [p.est_time for p in plans]
    plan = StepPlan(ids, tuple(int(x) for x in l_), k, plans, (), float(est), float(lb),
                    (time.perf_counter() - t0) * 1e3)
    strat = tuple(StrategyReport(i, names[i], bounds[i], ests[i]) for i in range(len(profiles)))
    return StepSelection(plan, strat, tuple(reports), rank_spread(times), max_over_mean(times), cut)


def plan_step(lengths, profiles: Sequence[StrategyProfile], *, packer: Packer = pack, seed: int = 0,
              exact: bool = False, seq_ids: Sequence[int] | None = None,
              config: PlannerConfig = DEFAULT) -> StepPlan:
    """select_step(...).plan"""
    return select_step(lengths, profiles, packer=packer, seed=seed, exact=exact, seq_ids=seq_ids, config=config).plan
