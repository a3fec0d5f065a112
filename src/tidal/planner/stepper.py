"""The per-step planning loop as a typed, resumable object: step source -> delay queues -> select_step -> CP sharding.

`StepPlanner` plans one step of a `StepSource` at a time (this layer must not import `tidal.data`), step k with seed
`seed + k`, and its `state_dict()` resumes the stream exactly; docs/planner.md, "The planning loop", states each part.
Everything except `StepPlan.plan_ms` (wall clock) is deterministic in the inputs and `PlanningOptions.seed`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme, parse_strategies
from tidal.core.strategy import Strategy, place
from tidal.costmodel.base import CostModel, LatencyCoeffs, pipeline_device
from tidal.costmodel.sync import SyncPricing
from tidal.planner import packing
from tidal.planner.cp_adaptive import charged_pipeline_time, choose_for_micro_batches, cp_kernel
from tidal.planner.metrics import token_delay
from tidal.planner.proposal import propose
from tidal.planner.select import Packer, StepSelection, StrategyProfile, profile_strategies, select_step

CP_SHARDINGS = ("adaptive", "per-seq", "per-doc")
STATE_VERSION = 1


@dataclass(frozen=True)
class PlanningOptions:
    max_len: int  # longest sequence of a step (the context window)
    tokens_per_step: int
    packing: str = "hydraulis"  # hydraulis | wlb | wlb-fixed | fixed
    cp_sharding: str = "adaptive"  # adaptive | per-seq | per-doc
    exact: bool = False
    seed: int = 0
    rotate: bool = False  # step k on candidate k % len(candidates) only (tidal verify); else select over all
    budget_ms: float | None = None  # per-step planning budget (select_step): past it the best plan so far is kept

    def __post_init__(self) -> None:
        for name in ("max_len", "tokens_per_step", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or (name != "seed" and v < 1):
                what = "an integer" if name == "seed" else "a positive integer"
                raise TidalError(f"planning option {name} must be {what}, got {v!r}")
            object.__setattr__(self, name, int(v))  # numpy integers -> int, so state_dict() is JSON-safe
        if not isinstance(self.packing, str) or not self.packing:
            raise TidalError(f"planning option packing must be a packing's name, got {self.packing!r}")
        if self.cp_sharding not in CP_SHARDINGS:
            raise TidalError(f"unknown CP sharding {self.cp_sharding!r}; choose one of {', '.join(CP_SHARDINGS)}")
        if self.budget_ms is not None and not self.budget_ms >= 0:
            raise TidalError(f"planning option budget_ms must be >= 0, got {self.budget_ms!r}")
        for name in ("exact", "rotate"):
            if not isinstance(getattr(self, name), bool):
                raise TidalError(f"planning option {name} must be true or false, got {getattr(self, name)!r}")


class QueuedStep(Protocol):
    """One step out of delay queues: the incoming sequences (carried-over ones first), which of them run now."""

    step: int  # the queues' step counter
    seq_ids: tuple[int, ...]
    seq_lengths: tuple[int, ...]
    arrival: tuple[int, ...]  # the step each incoming sequence first arrived
    deferred: tuple[int, ...]  # indices into seq_ids carried to a later step

    @property
    def packed(self) -> tuple[int, ...]:  # indices into seq_ids that run this step
        ...


class DelayQueues(Protocol):
    """Queues that decide which of a step's sequences run now and which wait (WLB-LLM's outlier-delay queues,
    baselines/packings.py). States are immutable values with `empty`, `pending` (items with `seq_id`) and
    `to_dict()`; a config is whatever `step` needs, rebuilt when the cost model changes."""

    def config(self, first: Strategy, coeffs: LatencyCoeffs, mem_len: int, options: PlanningOptions) -> Any:
        ...

    def new_state(self) -> Any:
        ...

    def load_state(self, d: dict) -> Any:
        ...

    def step(self, state: Any, seq_ids: Sequence[int], lengths: Sequence[int], cfg: Any, *,
             flush: bool = False) -> tuple[QueuedStep, Any]:
        ...


@dataclass(frozen=True)
class Packing:
    """How a step's sequences become micro-batches: `pack` (select's packer protocol) and, where the packing defers
    sequences to later steps, its `queues` (None: every sequence runs in its own step)."""

    pack: Packer
    queues: DelayQueues | None = None


# the planner's own packing; baselines/packings.PACKINGS adds the compared systems' (callers hand it in, decision 106)
PLANNER_PACKINGS = MappingProxyType({"hydraulis": Packing(packing.pack)})


def get_packing(packings: Mapping[str, Packing], name: str) -> Packing:
    """The packing called `name`; TidalError naming the choices when there is none."""
    if name not in packings:
        raise TidalError(f"unknown packing {name!r}; choose one of {', '.join(packings)}")
    return packings[name]


class StepSource(Protocol):
    """Where steps of sequences come from (`tidal.data.sampler.TokenBudgetSampler` satisfies it)."""

    def next_step(self) -> Any:  # object with seq_ids, lengths, doc_ids, starts; or None at the end
        ...

    def state_dict(self) -> dict:
        ...

    def load_state_dict(self, d: dict) -> None:
        ...


@dataclass(frozen=True)
class PlannedStep:
    index: int  # 0, 1, 2, ... steps emitted by this planner (WLB flush steps included)
    plan: StepPlan  # incoming sequences (deferred ones included), strategy, pipelines with cp_sharding filled
    selection: StepSelection | None  # None for steps with nothing to run now
    token_delay: float  # mean delay in steps of the tokens run this step (WLB), else 0
    docs: tuple[tuple[int, int, int], ...]  # per entry of plan.seq_lengths: (doc_id, start in the document, length)


def read_step(st) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int, int], ...]]:
    """(seq_ids, lengths, docs) of a step from a `StepSource`, docs as PlannedStep.docs; the four fields must be
    equally long."""
    ids = tuple(int(x) for x in st.seq_ids)
    lens = tuple(int(x) for x in st.lengths)
    if not len(ids) == len(lens) == len(st.doc_ids) == len(st.starts):
        raise TidalError(f"step source gave {len(ids)} seq_ids, {len(lens)} lengths, {len(st.doc_ids)} doc_ids and "
                         f"{len(st.starts)} starts")
    return ids, lens, tuple((int(d), int(s), ln) for d, s, ln in zip(st.doc_ids, st.starts, lens))


def build_candidates(cost_model: CostModel, strategies: str, sample_lengths: np.ndarray | None, *,
                     tokens_per_step: int, max_len: int, seed: int, sync: SyncPricing | None = None,
                     cp_policy: str | None = None, schemes=None, refine: bool = False) -> tuple[Strategy, ...]:
    """Candidate strategies: "auto" runs the proposal DP on `sample_lengths` (clipped to max_len; `sync`, `cp_policy`:
    its sampled planning charges them, as StepPlanner's; `schemes`: the proposal's scheme space, default
    proposal.scheme_space's; `refine`: the proposal's local search, decision 99); anything else is parsed as
    `;`-separated strategies and placed on the cluster. Checks that some scheme holds max_len tokens."""
    model, cluster = cost_model.model, cost_model.cluster
    if strategies.strip().lower() == "auto":
        if sample_lengths is None or len(sample_lengths) == 0:
            raise TidalError("strategies 'auto' needs a sample of document lengths to propose candidates from")
        sample = np.minimum(np.asarray(sample_lengths, dtype=np.int64), max_len)
        cands = propose(sample, cost_model, tokens_per_step=tokens_per_step, max_len=max_len, seed=seed, sync=sync,
                        cp_policy=cp_policy, schemes=schemes, refine=refine).strategies
    else:
        cands = tuple(place(s, cluster, model) for s in parse_strategies(strategies))
    if not cands:
        raise TidalError("no candidate strategy to plan with")
    best = max((cost_model.max_len(p.scheme, pipeline_device(cluster, p)), str(p.scheme))
               for s in cands for p in s.pipelines)
    if best[0] < max_len:
        raise TidalError(f"--max-len {max_len} exceeds the MaxLen of every scheme (largest {best[0]} for "
                         f"{best[1]}); lower --max-len or add a scheme with more TP/CP")
    return tuple(cands)


def plan_scheme(p: PipelinePlan, layers: int) -> ParallelScheme:
    """The scheme a pipeline of a plan runs: its layer split only when it is not the even one of `layers`."""
    scheme = ParallelScheme(p.tp, p.pp, p.cp)
    if p.layer_split is not None and tuple(p.layer_split) != scheme.stage_layers(layers):
        scheme = ParallelScheme(p.tp, p.pp, p.cp, tuple(p.layer_split))
    return scheme


def with_cp_sharding(step: StepPlan, cost_model: CostModel, policy: str) -> StepPlan:
    """Fill `cp_sharding` of every CP > 1 pipeline with micro-batches (cp_adaptive under `policy`) and charge its
    kernel imbalance in the pipeline's estimate (`cp_adaptive.charged_pipeline_time`, the simulator's charge)."""
    pipes = []
    for p in step.pipelines:
        if p.cp > 1 and p.micro_batches:
            dev = pipeline_device(cost_model.cluster, p)
            kern = cp_kernel(cost_model.model, p.tp, dev)
            modes = choose_for_micro_batches(step.seq_lengths, p.micro_batches, p.cp, kern, policy)
            k = cost_model.coeffs(plan_scheme(p, cost_model.model.layers), dev)
            est = charged_pipeline_time(step.seq_lengths, p.micro_batches, k, p.pp, p.cp, modes, kern)
            p = replace(p, cp_sharding=modes, est_time=max(p.est_time, est))
        pipes.append(p)
    est_step = max((p.est_time for p in pipes), default=step.est_step_time)
    return replace(step, pipelines=tuple(pipes), est_step_time=max(step.est_step_time, est_step))


def _embed(sel: StepPlan, now: list[int], ids: tuple[int, ...], lens: tuple[int, ...],
           deferred: tuple[int, ...]) -> StepPlan:
    """Re-index a plan of the `now` subset onto the step's full incoming list (which includes deferred ones)."""
    pipes = tuple(replace(p, micro_batches=tuple(tuple(now[i] for i in mb) for mb in p.micro_batches))
                  for p in sel.pipelines)
    return replace(sel, seq_ids=ids, seq_lengths=lens, pipelines=pipes, deferred=deferred)


class StepPlanner:
    """Plans a stream of steps; `next()` -> PlannedStep or None when the source and the WLB queues are empty."""

    def __init__(self, cost_model: CostModel, candidates: Sequence[Strategy], source: StepSource,
                 options: PlanningOptions, *, sync: SyncPricing | None = None, charge_cp: bool = False,
                 eq1: bool = False, packings: Mapping[str, Packing] = PLANNER_PACKINGS) -> None:
        """`sync`: charge each candidate pipeline's gradient pull/push in the selection (costmodel.sync, as the
        simulator prices it); `charge_cp`: charge CP kernel imbalance under `options.cp_sharding` in the selection
        too, not only in the chosen plan (charges.charge, decision 86). Both off: the estimates as before. `eq1`:
        price one-stage pipelines by Hydraulis Eq. 1 (the Hydraulis baseline, decision 97; PipeCost.eq1).
        `packings`: name -> Packing that `options.packing` names one of (the planner's own; baselines.packings.PACKINGS
        adds the compared systems')."""
        if not isinstance(options, PlanningOptions):
            raise TidalError(f"options must be PlanningOptions, got {type(options).__name__}")
        self.candidates: tuple[Strategy, ...] = tuple(candidates)
        self._charging = (sync, options.cp_sharding if charge_cp else None)
        self._eq1 = bool(eq1)
        self.source = source
        self.options = options
        chosen = get_packing(packings, options.packing)
        self._packer, self._queues = chosen.pack, chosen.queues
        self._wcfg: Any = None  # the queues' config (None: no queues)
        # the queues' state; without queues, what a loaded state held, kept for a later resume with queues
        self._wstate: Any = {} if self._queues is None else self._queues.new_state()
        self._cost(cost_model)
        self._in_flight: dict[int, tuple[int, int, int]] = {}  # deferred seq_id -> (doc_id, start, length)
        self._index = 0
        self._exhausted = False  # the source returned None (or flush() was called): only flush steps remain

    def set_cost_model(self, cost_model: CostModel) -> None:
        """Plan the steps after this call with `cost_model` (e.g. refitted online from measured steps): the same
        candidates, re-costed; WLB's workload model follows. Deterministic: planning depends only on the models in
        force and the stream, so replaying the same sequence of models replays the same plans."""
        if cost_model.model != self.cost_model.model or cost_model.cluster != self.cost_model.cluster:
            raise TidalError("set_cost_model: the new cost model is for another model or cluster")
        self._cost(cost_model)

    def _cost(self, cost_model: CostModel) -> None:
        """Cost the candidates (`profiles`) and the queues' workload model (their config) with `cost_model`."""
        self.profiles: tuple[StrategyProfile, ...] = profile_strategies(self.candidates, cost_model, *self._charging,
                                                                        eq1=self._eq1)
        self.cost_model = cost_model
        if self._queues is not None:
            self._wcfg = self._queues.config(self.candidates[0], self.profiles[0].pipes[0].coeffs,
                                             self.profiles[0].max_len, self.options)

    @property
    def long_doc_stats(self) -> dict:
        """The source's cumulative long-document counts ({} if the source does not keep them)."""
        return dict(getattr(self.source, "long_doc_stats", None) or {})

    # -- planning ---------------------------------------------------------------------------------------------

    def _plan(self, ids: tuple[int, ...], lens: tuple[int, ...], now: list[int], deferred: tuple[int, ...],
              docs: tuple[tuple[int, int, int], ...], t0: float, waited: list[int] | None) -> PlannedStep:
        k, opt = self._index, self.options
        arr = np.asarray(lens, dtype=np.int64)
        c = k % len(self.profiles) if opt.rotate else 0  # rotate: step k on candidate c only
        profiles = (self.profiles[c],) if opt.rotate else self.profiles
        if now:
            sel = select_step(arr[now], profiles, packer=self._packer, seed=opt.seed + k, exact=opt.exact,
                              seq_ids=[ids[i] for i in now], budget_ms=opt.budget_ms)
            if opt.rotate:
                sel = replace(sel, plan=replace(sel.plan, strategy=c),
                              strategies=tuple(replace(r, index=c) for r in sel.strategies))
            step = _embed(sel.plan, now, ids, lens, deferred)
        else:
            sel, step = None, StepPlan(ids, lens, c, (), deferred, 0.0, 0.0)
        step = with_cp_sharding(step, self.cost_model, opt.cp_sharding)
        step = replace(step, plan_ms=(time.perf_counter() - t0) * 1e3)
        delay = token_delay(arr[now], np.asarray(waited)[now]) if waited is not None and now else 0.0
        self._index += 1
        return PlannedStep(k, step, sel, delay, docs)

    def next(self) -> PlannedStep | None:
        """The next planned step; None once the source is exhausted and every WLB queue is flushed."""
        st = None if self._exhausted else self.source.next_step()
        self._exhausted = st is None
        t0 = time.perf_counter()
        if st is not None:
            ids, lens, docs = read_step(st)
            if self._queues is None:
                return self._plan(ids, lens, list(range(len(lens))), (), docs, t0, None)
            self._in_flight.update(zip(ids, docs))
            res, self._wstate = self._queues.step(self._wstate, ids, lens, self._wcfg)
        elif self._queues is None or self._wstate.empty:
            return None
        else:  # a flush step: every queue released
            res, self._wstate = self._queues.step(self._wstate, [], [], self._wcfg, flush=True)
            if not res.packed:  # cannot happen: the largest pending document always fits an empty micro-batch
                raise TidalError(f"{self.options.packing} flush made no progress")
        docs = tuple(self._in_flight[i] for i in res.seq_ids)
        self._in_flight = {res.seq_ids[i]: docs[i] for i in res.deferred}
        return self._plan(res.seq_ids, res.seq_lengths, sorted(res.packed), res.deferred, docs, t0,
                          [res.step - a for a in res.arrival])

    def __iter__(self) -> Iterator[PlannedStep]:
        while (ps := self.next()) is not None:
            yield ps

    def steps(self, n: int) -> Iterator[PlannedStep]:
        """At most `n` steps (steps from the source; WLB flush steps once it is exhausted count too)."""
        return itertools.islice(self, n)

    def flush(self) -> Iterator[PlannedStep]:
        """End the stream now: draw nothing more from the source and yield the WLB flush steps of whatever is still
        queued (none without WLB). `tidal plan --steps N` plans N steps, then flushes."""
        self._exhausted = True
        yield from self

    # -- resumable state --------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-safe: the source's state, WLB queues, in-flight (deferred) sequences, step counter, configuration."""
        return {
            "version": STATE_VERSION,
            **_fingerprint(self.options, self.candidates),
            "index": self._index,
            "exhausted": self._exhausted,
            "source": self.source.state_dict(),
            "wlb": self._wstate.to_dict() if self._queues is not None else self._wstate,  # the queues' state
            "in_flight": [[sid, *doc] for sid, doc in sorted(self._in_flight.items())],
        }

    def load_state_dict(self, d: dict) -> None:
        """Resume from `state_dict()` output of a planner with the same options and candidates (`carry_state`
        adapts another planner's)."""
        try:
            if d["version"] != STATE_VERSION:
                raise TidalError(f"planner state version {d['version']} is not {STATE_VERSION}")
            fp = {"options": dict(d["options"]), "candidates": list(d["candidates"])}
            mine = _fingerprint(self.options, self.candidates)
            if fp != mine:
                raise TidalError(f"planner state does not match this planner: state {fp} vs {mine}")
            wstate = self._queues.load_state(d["wlb"]) if self._queues is not None else dict(d["wlb"])
            in_flight = {int(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in d["in_flight"]}
            index, exhausted = int(d["index"]), bool(d["exhausted"])
            source = d["source"]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise TidalError(f"malformed planner state: {type(e).__name__}: {e}") from None
        pending = {p.seq_id for p in wstate.pending} if self._queues is not None else set()
        if pending != set(in_flight):
            raise TidalError("malformed planner state: in-flight sequences do not match the delay queues")
        self.source.load_state_dict(source)
        self._wstate, self._in_flight, self._index, self._exhausted = wstate, in_flight, index, exhausted


def _fingerprint(options: PlanningOptions, candidates: Sequence[Strategy]) -> dict:
    """What a planner's state must match to be loaded: its options and candidates."""
    return {"options": asdict(options), "candidates": [str(s) for s in candidates]}


def carry_state(d: dict, options: PlanningOptions, candidates: Sequence[Strategy]) -> tuple[dict, str]:
    """`d` (a planner's `state_dict()`) made loadable by a planner of `options` and `candidates`, and a one-line
    note ("" when nothing changed); TidalError when an option that changes the stream itself (max_len,
    tokens_per_step, seed; packing while sequences are queued) changed. docs/training.md, "Another strategy list"."""
    try:
        old_opts, old_cands = dict(d["options"]), list(d["candidates"])
    except (KeyError, TypeError, ValueError) as e:
        raise TidalError(f"malformed planner state: {type(e).__name__}: {e}") from None
    mine = _fingerprint(options, candidates)
    if old_opts == mine["options"] and old_cands == mine["candidates"]:
        return d, ""
    changed = {k: (old_opts.get(k), v) for k, v in mine["options"].items() if old_opts.get(k) != v}
    stream = {k: c for k, c in changed.items() if k in ("max_len", "tokens_per_step", "seed")}
    if "packing" in changed and d.get("in_flight"):  # queued sequences belong to the old packing's queues
        stream["packing"] = changed["packing"]
    if stream:
        what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in stream.items())
        raise TidalError(f"resume: the checkpoint's data stream cannot continue exactly once under changed options "
                         f"({what}); restore them, or start a new run without --resume")
    notes = []
    if old_cands != mine["candidates"]:
        notes.append(f"candidates {'; '.join(old_cands)} -> {'; '.join(mine['candidates'])}")
    notes += [f"{k} {a} -> {b}" for k, (a, b) in changed.items()]
    note = (f"resume: planner rebuilt for {', '.join(notes)}; data position, {len(d.get('in_flight') or [])} queued "
            f"sequences and step counter carried over")
    return {**d, **mine}, note
