"""Candidates costed once per run: a placed strategy with its per-pipeline cost (`StrategyProfile`), reused for every
step's selection (select.py, which re-exports both names)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from tidal.core.errors import TidalError
from tidal.core.strategy import Strategy
from tidal.costmodel.base import CostModel, pipeline_device
from tidal.costmodel.sync import SyncPricing
from tidal.planner.bounds import ClassArrays, PipeCost, group_pipes
from tidal.planner.charges import Charges, charges_of


@dataclass(frozen=True)
class StrategyProfile:
    """A placed candidate with its per-pipeline cost (computed once, reused for every step)."""

    strategy: Strategy
    pipes: tuple[PipeCost, ...]
    layer_splits: tuple[tuple[int, ...], ...]
    charges: Charges | None = None  # the pull/push and CP imbalance charged in its estimates (None: neither)

    @cached_property
    def max_len(self) -> int:
        return max(p.max_len for p in self.pipes)

    @cached_property
    def class_arrays(self) -> ClassArrays:
        """bounds.ClassArrays of group_pipes(pipes) (the bounds' per-class arrays), computed once per profile
        (hashing 600 pipelines costs ~1 ms per bound)."""
        return ClassArrays.of(group_pipes(self.pipes))


def profile_strategies(candidates: Sequence[Strategy], cost_model: CostModel, sync: SyncPricing | None = None,
                       cp_policy: str | None = None, *, eq1: bool = False) -> tuple[StrategyProfile, ...]:
    """Cost every pipeline of every candidate with `cost_model` (coefficients of its bounding device type); with
    `sync`, each pipeline's gradient pull/push is charged in select_step's estimates, and with `cp_policy` (a CP
    sharding policy) each CP pipeline's kernel imbalance (charges.charge: the simulator's prices). `eq1`: price
    one-stage pipelines by Hydraulis Eq. 1 (PipeCost.eq1; the Hydraulis baseline, decision 97)."""
    if not candidates:
        raise TidalError("no candidate strategy to plan with")
    out = []
    for s in candidates:
        pipes, splits = [], []
        for p in s.pipelines:
            dev = pipeline_device(cost_model.cluster, p)
            ml = cost_model.max_len(p.scheme, dev)
            if ml < 1:
                raise TidalError(f"strategy {s}: {p.scheme.short()} does not fit in {dev.name} memory (MaxLen 0)")
            pipes.append(PipeCost.of(cost_model.coeffs(p.scheme, dev), p.scheme.pp, ml, eq1))
            splits.append(p.scheme.stage_layers(cost_model.model.layers))
        ch = charges_of(s, tuple(pipes), splits, cost_model, sync, cp_policy)
        out.append(StrategyProfile(s, tuple(pipes), tuple(splits), ch))
    return tuple(out)
