"""Candidates costed once per run: a placed strategy with its per-pipeline cost (`StrategyProfile`), reused for every
step's selection (select.py, which re-exports both names)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.strategy import Strategy
from tidal.costmodel.base import CostModel, pipeline_device
from tidal.planner.bounds import ClassArrays, PipeCost, group_pipes


@dataclass(frozen=True)
class StrategyProfile:
    """A placed candidate with its per-pipeline cost (computed once, reused for every step)."""

    strategy: Strategy
    pipes: tuple[PipeCost, ...]
    layer_splits: tuple[tuple[int, ...], ...]

    @cached_property
    def max_len(self) -> int:
        return max(p.max_len for p in self.pipes)

    @cached_property
    def grouped(self) -> tuple[tuple[PipeCost, ...], np.ndarray]:
        """bounds.group_pipes(pipes), computed once per profile (hashing 600 pipelines costs ~1 ms per bound)."""
        return group_pipes(self.pipes)

    @cached_property
    def class_arrays(self) -> ClassArrays:
        """bounds.ClassArrays of `grouped` (the bounds' per-class arrays), computed once per profile."""
        return ClassArrays.of(self.grouped)


def profile_strategies(candidates: Sequence[Strategy], cost_model: CostModel) -> tuple[StrategyProfile, ...]:
    """Cost every pipeline of every candidate with `cost_model` (coefficients of its bounding device type)."""
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
            pipes.append(PipeCost.of(cost_model.coeffs(p.scheme, dev), p.scheme.pp, ml))
            splits.append(p.scheme.stage_layers(cost_model.model.layers))
        out.append(StrategyProfile(s, tuple(pipes), tuple(splits)))
    return tuple(out)
