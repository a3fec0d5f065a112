"""The improvement passes of `select.assign` as one pipeline (issue 27, decision 95).

After the first dispatch and its alternatives are packed, `improve` runs the passes named in `PlannerConfig.passes`,
in PASS_ORDER, under one rule: a pass runs while

- the plan is more than its gap above the candidate's bound `target` (est > target (1 + gap)),
- the candidate's bound can still beat the step's incumbent (target < `beat`, select_step's pruning),
- the step's time budget (deadline) has not passed, and
- its per-step allowance (`Allowance`, created by select_step) is not spent;

its result is kept only if strictly faster. A pass spends its allowance itself, once per costly attempt (a
re-dispatch), so a pass that finds nothing to do costs nothing. Every pass returns a valid plan of all the step's
documents or None.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan
from tidal.planner.bounds import check_pipe
from tidal.planner.config import PASS_ORDER, PlannerConfig
from tidal.planner.dispatch import dispatch, restart_dispatch
from tidal.planner.exchange import exchange
from tidal.planner.fill import fill_dispatch, worth_filling
from tidal.planner.packing import Packer, pack, pipeline_time
from tidal.planner.pipecost import packed_value
from tidal.planner.polish import polish
from tidal.planner.profiles import StrategyProfile
from tidal.planner.repair import repair

Plans = tuple[PipelinePlan, ...]


@dataclass
class Context:
    """One candidate's assignment, as the passes see it."""
    lengths: np.ndarray  # int64
    prof: StrategyProfile
    packer: Packer
    seed: int
    target: float  # the candidate's lower bound (0: none)
    deadline: float | None  # perf_counter
    cfg: PlannerConfig
    objective: float  # the first dispatch's objective (the MaxLen retry compares packed pipelines with it)
    orders: tuple | None = dataclasses.field(default=None, repr=False)  # dispatch.length_orders(lengths), if sorted

    def on_time(self) -> bool:
        return self.deadline is None or time.perf_counter() < self.deadline


class Allowance:
    """How many more costly attempts each pass may make in this step (select_step makes one per step and passes it
    to every candidate's assign): keyed by pass name; a pass not named has no limit; None: no limit at all."""

    def __init__(self, counts: dict[str, int] | None = None):
        self.counts = None if counts is None else dict(counts)

    @classmethod
    def for_step(cls, cfg: PlannerConfig) -> Allowance:
        return cls({"late_restarts": cfg.late_per_step, "shrink": cfg.shrink_per_step, "fill": cfg.fill_per_step,
                    "repair": cfg.repair_per_step, "exchange": cfg.exchange_per_step})

    def left(self, name: str) -> bool:
        return self.counts is None or self.counts.get(name, 1) > 0

    def spend(self, name: str) -> None:
        if self.counts is not None and name in self.counts:
            self.counts[name] -= 1


@dataclass(frozen=True)
class Pass:
    """One improvement pass: `name` (its PASS_ORDER entry, the key of its allowance); `gap(ctx)`: skipped unless the
    plan is more than this factor above ctx.target; `run(ctx, est, plans, left)`: a candidate plan (kept by `improve`
    only if faster), or None."""
    name: str
    gap: Callable[[Context], float]
    run: Callable[[Context, float, Plans, Allowance], tuple[float, Plans] | None]


def improve(ctx: Context, est: float, plans: Plans, left: Allowance, beat: float = float("inf"),
            passes: Mapping[str, Pass] | None = None) -> tuple[float, Plans]:
    """The passes of ctx.cfg.passes in order under the module doc's one rule; (estimate, plans). `passes` maps names
    to passes (default PASSES; a test may give its own)."""
    table = PASSES if passes is None else passes
    for name in ctx.cfg.passes:
        p = table[name]
        if ctx.target * (1 + p.gap(ctx)) < est and ctx.target < beat and left.left(name) and ctx.on_time():
            res = p.run(ctx, est, plans, left)
            if res is not None and res[0] < est:
                est, plans = res
    return est, plans


def polished(ctx: Context, est: float, plans: Plans) -> tuple[float, Plans]:
    """Decision 60, the `polish` pass: polish.polish (cfg.polish_rounds rounds) when the polish pass is on and the
    plan is above ctx.target by more than cfg.shrink_done; also run on a plan another pass produced (decisions 64,
    68). It has no allowance."""
    cfg = ctx.cfg
    if "polish" in cfg.passes and cfg.polish_rounds and ctx.target * (1 + cfg.shrink_done) < est:
        return polish(ctx.lengths, ctx.prof.pipes, plans, est, target=ctx.target, rounds=cfg.polish_rounds,
                      light=cfg.polish_light)
    return est, plans


def late_restarts_pass(ctx: Context, est: float, plans: Plans, left: Allowance) -> tuple[float, Plans] | None:
    """Decisions 59, 65: random-order restarts (dispatch.restart_dispatch) of a step too large for the dispatch's own
    (cfg.restart_max < B x D <= cfg.late_restart_max: cfg.late_restarts of cfg.late_rounds rounds, gap cfg.late_gap;
    up to cfg.late_restart_max_big: cfg.late_big_restarts with the full local search, gap cfg.late_gap_big)."""
    cfg = ctx.cfg
    if not cfg.restart_max < _size(ctx) <= cfg.late_restart_max_big:
        return None
    left.spend("late_restarts")
    big = _size(ctx) > cfg.late_restart_max
    alt = restart_dispatch(ctx.lengths, ctx.prof.pipes, cfg.late_big_restarts if big else cfg.late_restarts,
                           seed=ctx.seed, below=est, target=ctx.target, deadline=ctx.deadline,
                           max_rounds=None if big else cfg.late_rounds, orders=ctx.orders)
    if alt is None:
        return None
    return pack_groups(ctx.lengths, ctx.prof, alt.groups, ctx.packer, False, limit=est, order=by_load(alt))


def shrink_pass(ctx: Context, est: float, plans: Plans, left: Allowance) -> tuple[float, Plans] | None:
    """Decision 58: the dispatch charges ceil(tokens / MaxLen) micro-batches; when a pipeline's packing needed more
    and that set the step time above the dispatch objective (by cfg.shrink_gap), dispatch again with that pipeline
    class's MaxLen scaled by each of cfg.shrink_fracs in turn (so it is given fewer tokens than it can nominally hold)
    and pack with the real MaxLen; the fastest plan. Each re-dispatch spends one of the allowance; no gap."""
    cfg, l_, pipes = ctx.cfg, ctx.lengths, ctx.prof.pipes
    over = set()
    for pl, pc in zip(plans, pipes):
        # first, so the token sums run only for these (800 pipelines)
        if pl.est_time > ctx.objective * (1 + cfg.shrink_gap):
            tokens = sum(int(l_[list(mb)].sum()) for mb in pl.micro_batches)
            if len(pl.micro_batches) > -(-tokens // pc.max_len):
                over.add(pc)
    if not over:
        return None
    longest = int(l_.max())
    best = None
    for frac in cfg.shrink_fracs:
        if not ctx.on_time() or not left.left("shrink"):
            break
        shrunk = [dataclasses.replace(pc, max_len=max(1, int(pc.max_len * frac))) if pc in over else pc
                  for pc in pipes]
        if longest > max(pc.max_len for pc in shrunk):
            continue
        left.spend("shrink")
        disp = dispatch(l_, shrunk, seed=ctx.seed, restarts=0, target=ctx.target, deadline=ctx.deadline,
                        max_rounds=cfg.shrink_rounds, config=cfg, orders=ctx.orders)
        # packed most-loaded first, given up at the first pipeline that is no faster than the plan it must beat
        est2, plans2 = pack_groups(l_, ctx.prof, disp.groups, ctx.packer, False, limit=est, order=by_load(disp))
        if est2 < est:  # not monotone in the fraction (which documents still fit changes), so all are tried
            est, plans = best = est2, plans2
            if est <= ctx.target * (1 + cfg.shrink_done):
                break
    return best


def fill_pass(ctx: Context, est: float, plans: Plans, left: Allowance) -> tuple[float, Plans] | None:
    """Decision 68: the plan re-dispatched with its token-full single-micro-batch pipelines filled first
    (fill.fill_dispatch, cap the bound times 1 + cfg.fill_slack), packed and polished; gap cfg.fill_gap. One
    re-dispatch spends one of the allowance."""
    if ctx.target <= 0:
        return None
    cap = ctx.target * (1 + ctx.cfg.fill_slack)
    if not worth_filling(ctx.lengths, ctx.prof.pipes, plans, cap, est):
        return None
    left.spend("fill")
    groups = fill_dispatch(ctx.lengths, ctx.prof.pipes, plans, cap, deadline=ctx.deadline)
    if groups is None:
        return None
    est2, plans2 = pack_groups(ctx.lengths, ctx.prof, groups, ctx.packer, False, limit=est)
    if est2 < est and ctx.on_time():
        est2, plans2 = polished(ctx, est2, plans2)
    return est2, plans2


def one_stage(ctx: Context, plans: Plans, left: Allowance, name: str, cap: int, rework) -> tuple[float, Plans] | None:
    """The run both one-stage passes share: on a plan whose every pipeline is one-stage (PP = 1, priced V c + W) and
    B x D <= `cap`, `rework(bins)` (the plan's micro-batches as lists of document ids per pipeline) returns a result
    with ``.valid()`` and new ``.bins``, or None when nothing changed; the allowance is spent only then, the result
    is checked (each document once, none over MaxLen) and each changed pipeline timed by pipeline_time."""
    if any(p.pp != 1 or p.eq1 for p in ctx.prof.pipes) or _size(ctx) > cap:
        return None
    res = rework([[list(mb) for mb in pl.micro_batches] for pl in plans])
    if res is None:
        return None
    left.spend(name)
    if not res.valid():
        raise TidalError(f"the {name} pass lost a document or overfilled a micro-batch")
    return repriced(ctx.lengths, ctx.prof.pipes, plans, res.bins)


def repair_pass(ctx: Context, est: float, plans: Plans, left: Allowance) -> tuple[float, Plans] | None:
    """Decision 134: repair.repair (MBS repack, drop a micro-batch, rebalance) under cfg.repair_max, gap
    cfg.repair_gap; spends only when a pipeline was repacked into fewer micro-batches (the costly part follows)."""
    cfg = ctx.cfg
    return one_stage(ctx, plans, left, "repair", cfg.repair_max, lambda bins: repair(
        ctx.lengths, ctx.prof.pipes, bins, excess=cfg.repair_excess, tries=cfg.repair_tries, rounds=cfg.repair_rounds,
        drops=cfg.repair_drops, moves=cfg.repair_moves, partners=cfg.repair_partners, deadline_ok=ctx.on_time)[0])


def exchange_pass(ctx: Context, est: float, plans: Plans, left: Allowance) -> tuple[float, Plans] | None:
    """Decision 136: exchange.exchange (compound moves around the bottleneck) under cfg.exchange_max, gap
    cfg.exchange_gap; spends only when a move was made."""
    cfg = ctx.cfg

    def rework(bins):
        ex, made = exchange(ctx.lengths, ctx.prof.pipes, bins, moves=cfg.exchange_moves, cands=cfg.exchange_cands,
                            partners=cfg.exchange_partners, eject=cfg.exchange_eject, depth=cfg.exchange_depth,
                            deadline_ok=ctx.on_time)
        return ex if made else None

    return one_stage(ctx, plans, left, "exchange", cfg.exchange_max, rework)


# the registry (read-only: a test gives `improve` its own table instead of changing this one)
PASSES: Mapping[str, Pass] = MappingProxyType({p.name: p for p in (
    Pass("late_restarts", lambda ctx: ctx.cfg.late_gap_big if _size(ctx) > ctx.cfg.late_restart_max
         else ctx.cfg.late_gap, late_restarts_pass),
    Pass("shrink", lambda ctx: 0.0, shrink_pass),
    Pass("polish", lambda ctx: ctx.cfg.shrink_done, lambda ctx, est, plans, left: polished(ctx, est, plans)),
    Pass("fill", lambda ctx: ctx.cfg.fill_gap, fill_pass),
    Pass("repair", lambda ctx: ctx.cfg.repair_gap, repair_pass),
    Pass("exchange", lambda ctx: ctx.cfg.exchange_gap, exchange_pass))})
assert tuple(PASSES) == PASS_ORDER


def _size(ctx: Context) -> int:
    return ctx.lengths.size * len(ctx.prof.pipes)


def by_load(disp) -> list[int]:
    """Pipeline indices by descending dispatch load (ties by index): pack_groups' order when it may give up early."""
    return sorted(range(len(disp.loads)), key=lambda j: (-disp.loads[j], j))


def repriced(lengths: np.ndarray, pipes, plans: Plans, bins) -> tuple[float, Plans]:
    """The plans with each pipeline whose micro-batches (document ids) differ from `bins` given those, timed by
    pipeline_time: (step estimate, plans)."""
    lf, out = lengths.astype(np.float64), list(plans)
    for j, (pl, bs) in enumerate(zip(plans, bins)):
        mbs = tuple(sorted(tuple(sorted(b)) for b in bs if b))  # by first (smallest) index, as the packer's finish
        if mbs != tuple(sorted(tuple(sorted(b)) for b in pl.micro_batches)):
            out[j] = dataclasses.replace(pl, micro_batches=mbs,
                                         est_time=pipeline_time(lf, mbs, pipes[j].coeffs, pipes[j].pp))
    return max(p.est_time for p in out), tuple(out)


def check_packing(mbs, n: int, sub: np.ndarray, max_len: int) -> None:
    """Every one of the packer's n sequences exactly once, no micro-batch over max_len tokens (one-line errors)."""
    flat, mb_of, v = flatten(mbs)
    if flat.size != n or (n and (flat.min() < 0 or flat.max() >= n or np.bincount(flat, minlength=n).max() != 1)):
        raise TidalError(f"packer returned a packing that does not hold each of its {n} sequences exactly once")
    tokens = np.bincount(mb_of, weights=sub[flat], minlength=v)
    if tokens.size and tokens.max() > max_len:  # token counts < 2^53: the float sums are exact
        raise TidalError(f"packer returned a micro-batch of {int(tokens.max())} tokens > MaxLen {max_len}")


def flatten(mbs) -> tuple[np.ndarray, np.ndarray, int]:
    """(sequence indices of all micro-batches in order, the micro-batch of each, micro-batch count)."""
    sizes = [len(mb) for mb in mbs]
    flat = np.fromiter(itertools.chain.from_iterable(mbs), dtype=np.int64, count=sum(sizes))
    return flat, np.repeat(np.arange(len(sizes)), sizes), len(sizes)


def pack_groups(lengths: np.ndarray, prof: StrategyProfile, groups, packer: Packer, exact: bool,
                limit: float = float("inf"), order=None) -> tuple[float, Plans]:
    """Pack every pipeline's group: (step estimate, plans). With a finite `limit`, packing stops at the first pipeline
    whose time reaches it and returns (inf, ()): `order` (pipeline indices, e.g. by descending dispatch load) says
    which are packed first. With `pack` (heuristic), the pipelines it would pack one call at a time are packed in
    one compiled call per chunk of `order` (pack_batch: the same packings and floats; all at once when `limit` is
    infinite, else chunks of 8, 16, 32, ... so that an early stop wastes little)."""
    plans: list = [None] * len(prof.pipes)
    lf = lengths.astype(np.float64)  # once, not per pipeline in pipeline_time
    seq = list(range(len(prof.pipes))) if order is None else list(order)
    batch = packer is pack and not exact
    pos, size = 0, (len(seq) if limit == float("inf") else 8)
    while pos < len(seq):
        chunk = seq[pos:pos + max(1, size)]
        pos, size = pos + len(chunk), 2 * size
        done = pack_batch(lengths, lf, prof, groups, chunk) if batch else None
        for j in chunk:
            mbs, est = done[j] if done is not None else pack_one(lengths, lf, prof, groups, packer, exact, j)
            if est >= limit:
                return float("inf"), ()
            pl = prof.strategy.pipelines[j]
            plans[j] = PipelinePlan(pl.scheme.tp, pl.scheme.pp, pl.scheme.cp, pl.devices, prof.pipes[j].max_len, mbs,
                                    est, layer_split=prof.layer_splits[j])
    return max((p.est_time for p in plans), default=0.0), tuple(plans)


def pack_one(lengths: np.ndarray, lf: np.ndarray, prof: StrategyProfile, groups, packer: Packer, exact: bool,
              j: int):
    """Pipeline j's group packed on its own: (micro-batches of step indices, time)."""
    pipe, group = prof.pipes[j], groups[j]
    idx = np.asarray(group, dtype=np.int64)
    if idx.size == 0:
        return (), 0.0
    sub = lengths[idx]
    if packer is pack:  # it checks its own packing (decision 69's review: 0.8 ms per step here), names the
        # sequences by idx, and its est_time is pipeline_time of these micro-batches (the same floats)
        res = pack(sub, pipe.coeffs, pipe.pp, pipe.max_len, exact=exact, ids=idx)
        return res.micro_batches, res.est_time
    res = packer(sub, pipe.coeffs, pipe.pp, pipe.max_len, exact=exact)
    check_packing(res.micro_batches, idx.size, sub, pipe.max_len)
    gl = idx.tolist()
    mbs = tuple(tuple(map(gl.__getitem__, mb)) for mb in res.micro_batches if len(mb))
    return mbs, pipeline_time(lf, mbs, pipe.coeffs, pipe.pp)  # another packer's est_time is not trusted


def pack_batch(lengths: np.ndarray, lf: np.ndarray, prof: StrategyProfile, groups, chunk) -> dict | None:
    """{j: (micro-batches, time)} for every pipeline of `chunk`, as pack_one with `pack` gives it: the pipelines `pack`
    packs with its heuristic (>= 2 sequences, not a PP = 1 pipeline whose tokens fit one micro-batch) in one
    kernels_batch.pack_many call (pack's own pack_core on each, so the same packings and floats), the one-micro-batch
    ones timed together (pipeline_time's sums, by kernels_sums.mb_works per coefficient group), the others as pack
    does. None when an input would make `pack` raise (then pack_one raises it, in order)."""
    from tidal.planner import kernels_batch, kernels_sums

    out: dict = {}
    js, subs, ids, singles = [], [], [], []
    ones: dict = {}  # one micro-batch each, by work coefficients
    for j in chunk:
        pipe = prof.pipes[j]
        idx = np.asarray(groups[j], dtype=np.int64)
        if idx.size == 0:
            out[j] = ((), 0.0)
            continue
        sub = lengths[idx]
        if pipe.pp == 1 and pipe.c > 0 and int(sub.sum()) <= pipe.max_len:
            # pack's own answer, without its per-call overhead (hundreds of such pipelines at 1024 GPUs): with PP = 1
            # and c > 0, one micro-batch (c + W) beats every V >= 2 (>= W + V c), so pack returns it
            ones.setdefault((pipe.a, pipe.b, pipe.d), []).append((j, idx))
        elif idx.size == 1:
            singles.append(j)
        else:
            js.append(j)
            subs.append(sub)
            ids.append(idx)
    for (a, b, d), got in ones.items():  # pipeline_time of one micro-batch: its work W as np.sum sums it, c + W
        works = kernels_sums.loops().mb_works(lf, np.concatenate([idx for _, idx in got]),
                                              np.array([idx.size for _, idx in got], dtype=np.int64), a, b, d)
        for (j, idx), w in zip(got, works.tolist()):
            pipe = prof.pipes[j]
            out[j] = ((tuple(idx.tolist()),), packed_value(pipe.q, pipe.c, w, pipe.c + w, 1))
    util = {}  # UtilLen per distinct pipeline cost (hundreds of pipelines share a few)
    try:
        for j in js:
            p = prof.pipes[j]
            if p not in util:
                co = p.coeffs
                check_pipe(p.pp, p.max_len, co)
                util[p] = co.util_len()
        for j in singles:  # one sequence: pack's own answer (a bad input raises here, then in pack_one, in order)
            out[j] = pack_one(lengths, lf, prof, groups, pack, False, j)
    except TidalError:
        return None
    if not js:
        return out
    pipes = [prof.pipes[j] for j in js]
    flat = np.concatenate(subs)
    bounds = np.zeros(len(js) + 1, dtype=np.int64)
    np.cumsum([x.size for x in subs], out=bounds[1:])
    M = np.array([p.max_len for p in pipes], dtype=np.int64)
    if int(flat.min()) < 1 or (np.maximum.reduceat(flat, bounds[:-1]) > M).any():
        return None
    S = np.add.reduceat(flat, bounds[:-1])
    su = np.array([int(x // util[p]) for x, p in zip(S.tolist(), pipes)], dtype=np.int64)
    a, b, c, d = (np.array([getattr(p, k) for p in pipes], dtype=np.float64) for k in "abcd")
    q = np.array([p.q for p in pipes], dtype=np.float64)
    ol, mb, nmb, est, tmax = kernels_batch.loops().pack_many(flat, bounds, a, b, d, c, q, M, S, su)
    for g, j in enumerate(js):
        if tmax[g] > M[g]:
            raise TidalError(f"packing produced a micro-batch of {int(tmax[g])} tokens > MaxLen {int(M[g])}")
        lo = int(bounds[g])
        o = ids[g][ol[lo:int(bounds[g + 1])]].tolist()
        ends = mb[lo:lo + int(nmb[g])].tolist()
        out[j] = (tuple(tuple(o[x:y]) for x, y in zip([0] + ends[:-1], ends)), float(est[g]))
    return out
