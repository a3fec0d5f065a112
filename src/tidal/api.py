"""Tidal as a library: per-step plans for any training loop (torchtitan, Megatron-LM, your own). docs/library.md.

    from tidal import Planner

    planner = Planner("llama3-8b", "h100x16", max_len=32768, tokens_per_step=262144, sample_lengths=lengths)
    step = planner.plan([812, 30211, 77, ...])      # the document lengths of one step, from your data loader
    step.strategy                                   # e.g. 'tp4+4*tp2+4*tp1'
    for pipe in step.pipelines:                     # what each pipeline runs, micro-batch by micro-batch
        pipe.ranks, pipe.tp, pipe.pp, pipe.cp, [mb.sequences for mb in pipe.micro_batches]
    step.role(rank)                                 # this rank's pipeline, stage, TP and CP coordinates

Nothing here imports torch; the plan is plain data. A micro-batch's `sequences` index the `lengths` given to
`plan()`, so a loop maps them straight back to its own batch. Every sequence of the step is in exactly one
micro-batch of one pipeline (`packing` "hydraulis" or "fixed": no sequence is deferred to a later step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tidal.baselines.packings import PACKINGS
from tidal.core.cluster import ClusterSpec, get_cluster
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, get_model
from tidal.core.plan import StepPlan
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import CostModel
from tidal.costmodel.loader import load_cost_model
from tidal.costmodel.sync import SyncPricing
from tidal.planner.bounds import check_lengths
from tidal.planner.stepper import PlanningOptions, StepPlanner, build_candidates, plan_scheme

__all__ = ["MicroBatch", "PipelineAssignment", "Planner", "RankRole", "StepAssignment"]

LIBRARY_PACKINGS = ("hydraulis", "fixed")  # WLB defers documents across steps: a loop would have to carry them


@dataclass(frozen=True)
class MicroBatch:
    sequences: tuple[int, ...]  # indices into the lengths given to Planner.plan, packed into one varlen batch
    lengths: tuple[int, ...]  # their lengths (tokens)
    cp_sharding: str | None  # CP pipelines: "per-doc" (every document split over the CP ranks) or "per-seq"; else None


@dataclass(frozen=True)
class PipelineAssignment:
    scheme: str  # e.g. "tp2pp2", "cp2", "tp1" (core.scheme.ParallelScheme's notation)
    tp: int
    pp: int
    cp: int
    ranks: tuple[int, ...]  # global ranks, TP fastest, then CP, then pipeline stage (Megatron's order)
    micro_batches: tuple[MicroBatch, ...]  # run in this order by the pipeline schedule (1F1B)
    est_time_s: float  # the cost model's forward + backward time of this pipeline for this step


@dataclass(frozen=True)
class RankRole:
    pipeline: int  # index into StepAssignment.pipelines
    stage: int  # pipeline stage (0 .. pp-1)
    tp_rank: int
    cp_rank: int


@dataclass(frozen=True)
class StepAssignment:
    strategy: str  # the candidate this step runs, e.g. "tp2+2*tp1"
    pipelines: tuple[PipelineAssignment, ...]
    est_step_time_s: float  # the slowest pipeline's estimate
    lower_bound_s: float  # proven: no assignment of these lengths to any candidate is faster under the cost model
    plan: StepPlan  # the full plan (docs/plan-format.md), as `tidal plan --json` writes it

    def role(self, rank: int) -> RankRole | None:
        """Where `rank` works this step; None when the strategy leaves it idle."""
        for i, p in enumerate(self.pipelines):
            if rank in p.ranks:
                j = p.ranks.index(rank)
                return RankRole(i, j // (p.tp * p.cp), j % p.tp, (j // p.tp) % p.cp)
        return None


class _Feed:
    """A step source that yields the lengths handed to it, one step at a time (sequence ids are their indices)."""

    def __init__(self) -> None:
        self.lengths: tuple[int, ...] | None = None

    def next_step(self):
        lens, self.lengths = self.lengths, None
        if lens is None:
            return None
        ids = tuple(range(len(lens)))
        return SimpleNamespace(seq_ids=ids, lengths=lens, doc_ids=ids, starts=(0,) * len(lens))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


class Planner:
    """Plans one training step at a time for a model on a cluster: which strategy (a set of pipelines, each with its
    own TP/PP/CP), and which sequences each pipeline runs in which micro-batch.

    `model`: a preset name or a `tidal.core.model.ModelSpec` (any Llama-family shape); `cluster`: `TYPExN[+TYPExM]`
    (e.g. "a800x64", "h800x16+h20x32") or a `ClusterSpec`; `max_len`: the longest sequence of a step;
    `tokens_per_step`: the step's token budget. `strategies`: "auto" proposes candidates from `sample_lengths`
    (document lengths representative of the data, e.g. the first 20,000 of the corpus), or ';'-separated strategies
    such as "tp2+2*tp1;4*tp1". `cost_model`: a fitted model or profile from `tidal profile` (path), a CostModel, or
    None for the analytic model of the specs. `budget_ms`: a per-step planning time budget (None: plan to the end).
    `charges`: the proposal and each step's selection charge every candidate's gradient pull/push and CP kernel
    imbalance as `tidal simulate` executes them (as `tidal plan` and `tidal train` do; False: the ablation).
    `refine`: with "auto", the proposal's local search on its sampled estimate, as `tidal plan`, `tidal train` and
    the simulator's `tidal` system run it (decisions 99, 101; False: the plain proposal, faster to propose).
    Bad input raises `tidal.core.errors.TidalError` (a ValueError) with one line."""

    def __init__(self, model: str | ModelSpec, cluster: str | ClusterSpec, *, max_len: int, tokens_per_step: int,
                 strategies: str = "auto", sample_lengths: Sequence[int] | None = None,
                 cost_model: str | Path | CostModel | None = None, packing: str = "hydraulis",
                 cp_sharding: str = "adaptive", seed: int = 0, budget_ms: float | None = None,
                 charges: bool = True, refine: bool = True) -> None:
        spec = get_model(model) if isinstance(model, str) else model
        clu = get_cluster(cluster) if isinstance(cluster, str) else cluster
        if packing not in LIBRARY_PACKINGS:
            raise TidalError(f"Planner packing must be one of {', '.join(LIBRARY_PACKINGS)}, got {packing!r} (WLB "
                             f"defers documents to later steps: use tidal.planner.stepper.StepPlanner with a source)")
        if cost_model is None:
            cm = AnalyticCostModel(spec, clu)
        elif isinstance(cost_model, (str, Path)):
            cm = load_cost_model(cost_model, spec, clu)
        else:
            cm = cost_model
        sample = None if sample_lengths is None else np.asarray(sample_lengths, dtype=np.int64)
        options = PlanningOptions(max_len=max_len, tokens_per_step=tokens_per_step, packing=packing,
                                  cp_sharding=cp_sharding, seed=seed, budget_ms=budget_ms)
        sync = SyncPricing() if charges else None
        cands = build_candidates(cm, strategies, sample, tokens_per_step=tokens_per_step, max_len=max_len, seed=seed,
                                 sync=sync, cp_policy=cp_sharding if charges else None, refine=refine)
        self.model, self.cluster, self.cost_model, self.max_len = spec, clu, cm, max_len
        self._feed = _Feed()
        self._planner = StepPlanner(cm, cands, self._feed, options, sync=sync, charge_cp=charges, packings=PACKINGS)

    @property
    def candidates(self) -> tuple[str, ...]:
        """The strategies steps choose from (StepAssignment.strategy is one of them)."""
        return tuple(str(s) for s in self._planner.candidates)

    def plan(self, lengths: Sequence[int]) -> StepAssignment:
        """Plan one step of documents (or packed sequences) of these lengths, each at most `max_len`."""
        lens = tuple(int(x) for x in check_lengths(lengths))
        if lens and max(lens) > self.max_len:
            raise TidalError(f"a sequence of {max(lens)} tokens exceeds max_len {self.max_len}: split or truncate it")
        self._feed.lengths = lens
        ps = self._planner.next()
        if ps is None:  # cannot happen: the feed always has a step
            raise TidalError("the planner produced no step")
        return assignment(ps.plan, self.candidates[ps.plan.strategy], self.model.layers)


def assignment(step: StepPlan, strategy: str, layers: int) -> StepAssignment:
    """A StepPlan read as per-pipeline, per-micro-batch sequence lists (`layers`: the model's, to name a pipeline by
    its plain scheme when its layer split is the even one)."""
    pipes = []
    for p in step.pipelines:
        shard = p.cp_sharding or (None,) * len(p.micro_batches)
        mbs = tuple(MicroBatch(tuple(mb), tuple(step.seq_lengths[i] for i in mb), shard[k] if p.cp > 1 else None)
                    for k, mb in enumerate(p.micro_batches))
        pipes.append(PipelineAssignment(plan_scheme(p, layers).short(), p.tp, p.pp, p.cp, tuple(p.devices), mbs,
                                        p.est_time))
    return StepAssignment(strategy, tuple(pipes), step.est_step_time, step.lower_bound, step)
