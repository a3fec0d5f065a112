"""A class of identical many-micro-batch PP = 1 pipelines filled bin by bin (issue 9, decision 69).

(Written when a PP = 1 pipeline was priced at V times its slowest micro-batch; since decision 94 it is priced at
their sum, V c + W, which no filling order changes, so the fill now only rarely beats the packed plan: its plan is
kept only when faster.) A PP = 1 pipeline that runs V micro-batches took V times its slowest one, so a pipeline with
a small MaxLen (a tp1 of a 13B model holds 1,132 tokens) ran fast only if all V of its micro-batches were nearly
equally full. The dispatch gives such pipelines their share by tokens and work, longest documents first: they end
with mid-length documents that no packing balances (one 1,100-token document in a 1,132-token micro-batch next to
900-token ones), while the short documents that would even them out sit on the large pipelines.

`class_plan` builds the plan the other way round. For a step time T it cuts every pipeline of the class into V
micro-batches ("bins") of at most T / V - c work and MaxLen tokens (fewer when the work cap binds), and places the
step's documents longest first, each into the bin with the least work room left that still holds it (best fit
decreasing, over all documents: the short ones fill the gaps last). What does not fit goes to the other pipelines,
which the caller plans as a smaller strategy. Of a few (V, T) pairs, the one whose bins and the rest's greedy
dispatch objective promise the least is planned fully, and `select.assign` keeps it only if faster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from tidal.core.plan import PipelinePlan
from tidal.planner.bounds import PipeCost
from tidal.planner.config import DEFAULT, PlannerConfig
from tidal.planner.dispatch import dispatch_alternatives
from tidal.planner.packing import pipeline_time
from tidal.planner.profiles import StrategyProfile

# Knobs (PlannerConfig.class_*): class_min_v (the class's median micro-batch count must be at least this; fewer:
# packing balances them), class_slacks (step times tried: the candidate's bound times 1 + each), class_rounds
# (local-search rounds of the rest's screening dispatch; its greedy alone ranks them as well), class_v (micro-batch
# counts tried: the class's median plus each; 0 and 1: the same cell medians, more time), class_max_work (skipped
# when documents x bins exceeds this: the fill is O(documents x bins)), class_min_gain (the rest is planned only when
# the screening promises at least this factor under the plan).


def pick_class(pipes: Sequence[PipeCost], plans: Sequence[PipelinePlan],
               cfg: PlannerConfig = DEFAULT) -> tuple[list[int], int] | None:
    """(pipeline indices, median micro-batch count) of the class of identical PP = 1 pipelines (two or more, with
    at least one other pipeline beside them) that runs the most micro-batches in `plans`, if its median count is at
    least cfg.class_min_v; else None. Ties go to the class of the lowest pipeline index."""
    classes: dict[PipeCost, list[int]] = {}
    for j, pc in enumerate(pipes):
        if pc.pp == 1:
            classes.setdefault(pc, []).append(j)
    best: tuple[int, list[int]] | None = None
    for js in classes.values():
        if len(js) < 2 or len(js) == len(pipes):
            continue
        v = sum(len(plans[j].micro_batches) for j in js)
        if best is None or v > best[0]:
            best = (v, js)
    if best is None:
        return None
    vm = int(np.median([len(plans[j].micro_batches) for j in best[1]]))
    return (best[1], vm) if vm >= cfg.class_min_v else None


def token_cap(pc: PipeCost, work: float) -> int:
    """The most tokens x with a x^2 + b x + d <= `work` (0 when none), at most MaxLen."""
    if work < pc.d:
        return 0
    if pc.a > 0:
        x = (-pc.b + math.sqrt(pc.b * pc.b + 4.0 * pc.a * (work - pc.d))) / (2.0 * pc.a)
    elif pc.b > 0:
        x = (work - pc.d) / pc.b
    else:
        return pc.max_len
    x = min(float(pc.max_len), x)
    k = int(x)
    while k > 0 and pc.w1(float(k)) > work:  # the float root can sit one token above
        k -= 1
    return k


def _bfd(l_: np.ndarray, w: np.ndarray, order: np.ndarray, nb: int, kcap: int, wcap: float) -> np.ndarray:
    """Best fit decreasing into `nb` bins of `kcap` tokens and `wcap` work: each document (in `order`) into the bin
    with the least work room left that holds it (ties to the lowest bin), -1 where none does. The reference for
    kernels_pack.class_bfd."""
    troom = np.full(nb, kcap, dtype=np.int64)
    wroom = np.full(nb, wcap)
    out = np.full(l_.size, -1, dtype=np.int64)
    for i in order.tolist():
        x, wx = int(l_[i]), float(w[i])
        if x > kcap:
            continue
        ok = (troom >= x) & (wroom >= wx)
        if ok.any():
            b = int(np.argmin(np.where(ok, wroom - wx, np.inf)))
            troom[b] -= x
            wroom[b] -= wx
            out[i] = b
    return out


def class_bins(lengths: np.ndarray, pc: PipeCost, n: int, V: int, T: float, order: np.ndarray | None = None,
               compiled: bool = True) -> np.ndarray | None:
    """Bin (0 .. n V - 1; pipeline = bin // V) of every document for n pipelines of class `pc` run in V micro-batches
    within step time T, -1 for the documents left to the others; None when a bin holds no token."""
    kcap = token_cap(pc, T / V - pc.c)
    if kcap < 1:
        return None
    l_ = np.asarray(lengths, dtype=np.int64)
    w = pc.work(l_)
    if order is None:
        order = np.argsort(-l_, kind="stable")
    if compiled:
        from tidal.planner import kernels_pack

        if kernels_pack.AVAILABLE:
            return kernels_pack.class_bfd(l_, w, order, n * V, kcap, T / V - pc.c)
    return _bfd(l_, w, order, n * V, kcap, T / V - pc.c)


def class_times(lengths: np.ndarray, pc: PipeCost, n: int, V: int, bins: np.ndarray) -> np.ndarray:
    """Time of each of the n pipelines: the sum of its used bins' times, (used bins) c + their work (one stage,
    decision 94); 0 when empty."""
    put = bins >= 0
    b = bins[put]
    work = np.bincount(b, weights=pc.work(lengths[put]), minlength=n * V).reshape(n, V)
    used = np.bincount(b, minlength=n * V).reshape(n, V) > 0
    some = used.any(axis=1)
    return np.where(some, used.sum(axis=1) * pc.c + work.sum(axis=1), 0.0)


def class_micro_batches(bins: np.ndarray, n: int, V: int) -> list[tuple[tuple[int, ...], ...]]:
    """Per pipeline of the class, its non-empty bins as micro-batches of ascending step indices, ordered by their
    first index (packing.finish's order)."""
    put = np.flatnonzero(bins >= 0)
    order = put[np.argsort(bins[put], kind="stable")]  # by bin, ascending indices within each
    ends = np.cumsum(np.bincount(bins[put], minlength=n * V)).tolist()
    idx = order.tolist()
    out = []
    for p in range(n):
        mbs = [tuple(idx[(ends[b - 1] if b else 0):ends[b]]) for b in range(p * V, (p + 1) * V)]
        out.append(tuple(sorted((m for m in mbs if m), key=lambda m: m[0])))
    return out


def class_plan(lengths: np.ndarray, prof: StrategyProfile, plans: tuple[PipelinePlan, ...], est: float, target: float,
               plan_rest: Callable, deadline: float | None = None,
               pick: tuple[list[int], int] | None = None,
               cfg: PlannerConfig = DEFAULT) -> tuple[float, tuple[PipelinePlan, ...]]:
    """The plan with its many-micro-batch class filled bin by bin (module doc), if faster than `est`; else (est,
    plans). `prof` is the candidate's profile, `pick` pick_class's answer if the caller has it. `plan_rest(lengths,
    profile, T)` plans the other pipelines (a profile of them alone) and returns (estimate, plans) (select.assign).
    Of the (V, T) pairs, V the class's median micro-batch count (+ each of cfg.class_v) and T = `target` (1 +
    cfg.class_slacks), the one with the least max(slowest class pipeline, the rest's greedy dispatch objective) is
    planned fully, if that is at least a factor cfg.class_min_gain under `est` (the screening is close: below that the
    rest planned fully gained at most 0.1 %)."""
    if pick is None:
        pick = pick_class(prof.pipes, plans, cfg)
    if pick is None:
        return est, plans
    js, vm = pick
    pc, n = prof.pipes[js[0]], len(js)
    inside = set(js)
    rest = [j for j in range(len(prof.pipes)) if j not in inside]
    rpipes = [prof.pipes[j] for j in rest]
    top = max(p.max_len for p in rpipes)
    l_ = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-l_, kind="stable")
    best = None
    for V in (vm + dv for dv in cfg.class_v):
        if l_.size * n * V > cfg.class_max_work:
            continue
        for s in cfg.class_slacks:
            T = target * (1 + s)
            bins = class_bins(l_, pc, n, V, T, order)
            if bins is None:
                continue
            t_cls = float(class_times(l_, pc, n, V, bins).max())
            free = np.flatnonzero(bins < 0)
            if t_cls >= est * (1 - cfg.class_min_gain) or (free.size and int(l_[free].max()) > top):
                continue
            score = t_cls
            if free.size:
                first, _ = dispatch_alternatives(l_[free], rpipes, restarts=0, max_rounds=cfg.class_rounds, scan=False,
                                                 deadline=deadline)
                score = max(score, first.objective)
            if score < est * (1 - cfg.class_min_gain) and (best is None or score < best[0]):
                best = (score, V, T, bins, free)
    if best is None:
        return est, plans
    _, V, T, bins, free = best
    lf = l_.astype(np.float64)
    new: list = [None] * len(prof.pipes)
    for p, mbs in enumerate(class_micro_batches(bins, n, V)):
        j = js[p]
        pl = prof.strategy.pipelines[j]
        new[j] = PipelinePlan(pl.scheme.tp, pl.scheme.pp, pl.scheme.cp, pl.devices, pc.max_len, mbs,
                              pipeline_time(lf, mbs, pc.coeffs, 1), layer_split=prof.layer_splits[j])
    if free.size:
        strategy = dataclasses.replace(prof.strategy, pipelines=tuple(prof.strategy.pipelines[j] for j in rest))
        sub = dataclasses.replace(prof, strategy=strategy, pipes=tuple(rpipes),
                                  layer_splits=tuple(prof.layer_splits[j] for j in rest))
        _, sub_plans = plan_rest(l_[free], sub, T)
        ids = free.tolist()
        for q, j in enumerate(rest):
            sp = sub_plans[q]
            new[j] = dataclasses.replace(sp, micro_batches=tuple(tuple(ids[i] for i in mb) for mb in sp.micro_batches))
    else:
        for j in rest:
            new[j] = dataclasses.replace(plans[j], micro_batches=(), est_time=0.0)
    e_new = max(p.est_time for p in new)
    return (e_new, tuple(new)) if e_new < est else (est, plans)
