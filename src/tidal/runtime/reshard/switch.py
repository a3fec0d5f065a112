"""Fused strategy switching (Hetu v2 §6.2) and Hydraulis' pull / push (the LNK operator, §5.2).

`SwitchPlanner` caches plans by what they move: a repeated switch (same moves, or the same pair of strategies) returns
the cached CommPlan without replanning. Planning is pure python; `run` executes a plan with torch.distributed.

Pull: parameters from the fixed fully-sharded optimisation layout (dim 0 split over all N devices) to a strategy's
propagation layout. Push: gradients (partial over CP ranks and over pipelines) from the propagation layout back to
their fully-sharded owners, reduced. Both are BSR-tier moves (the DG union changes), i.e. mutual slices moved by
send / receive / local copy, with the partial sums reduced point-to-point at a root before they travel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.strategy import Strategy
from tidal.runtime.reshard.annotation import Annotation
from tidal.runtime.reshard.bsr import Topology
from tidal.runtime.reshard.deduce import (
    StageLayout,
    fully_sharded,
    holder_stages,
    model_param_shapes,
    param_annotation,
    param_infos,
    stages_of,
)
from tidal.runtime.reshard.execute import GroupCache, execute
from tidal.runtime.reshard.plan import CommPlan, TensorMove
from tidal.runtime.reshard.resolve import Resolver


def _annotations(model: ModelSpec, strategy: Strategy | StageLayout, names, grad: bool = False) -> list[Annotation]:
    """Parameter annotations, built once per distinct (holding stages, split kind): layers of a stage share them."""
    layout = stages_of(strategy, model)
    infos = param_infos(model)
    memo: dict[tuple, Annotation] = {}
    out = []
    for n in names:
        info = infos.get(n)
        if info is None:
            raise TidalError(f"model {model.name} has no parameter {n!r}")
        key = (tuple(holder_stages(p, info) for p in layout), info.tp_dim)
        if key not in memo:
            memo[key] = param_annotation(layout, model, n, grad, info)
        out.append(memo[key])
    return out


def switch_moves(model: ModelSpec, src: Strategy | StageLayout, dst: Strategy | StageLayout,
                 names: Sequence[str] | None = None) -> tuple[TensorMove, ...]:
    """Every parameter (or those in `names`) moving from strategy `src` to `dst`."""
    shapes = model_param_shapes(model)
    names = list(names or shapes)
    a, b = _annotations(model, src, names), _annotations(model, dst, names)
    return tuple(TensorMove(x, y, shapes[n]) for n, x, y in zip(names, a, b))


def pull_moves(model: ModelSpec, strategy: Strategy | StageLayout, devices: Sequence[int],
               names: Sequence[str] | None = None) -> tuple[TensorMove, ...]:
    """Parameters from the fully-sharded optimisation layout over `devices` to the strategy (Hydraulis pull)."""
    shapes = model_param_shapes(model)
    names = list(names or shapes)
    full = fully_sharded(devices, ())
    return tuple(TensorMove(full, y, shapes[n]) for n, y in zip(names, _annotations(model, strategy, names)))


def push_moves(model: ModelSpec, strategy: Strategy | StageLayout, devices: Sequence[int],
               names: Sequence[str] | None = None) -> tuple[TensorMove, ...]:
    """Gradients from the strategy (partial over CP and pipelines) to their fully-sharded owners (Hydraulis push)."""
    shapes = model_param_shapes(model)
    names = list(names or shapes)
    full = fully_sharded(devices, ())
    return tuple(TensorMove(x, full, shapes[n]) for n, x in zip(names, _annotations(model, strategy, names, True)))


class SwitchPlanner:
    """Plans many-tensor moves on one topology and caches them by (moves, fused, heuristics), and strategy switches
    by (kind, model, src, dst). Holds no process groups; pass a GroupCache to `run`."""

    def __init__(self, topology: Topology, itemsize: int = 2, max_plans: int = 64) -> None:
        self.resolver = Resolver(topology, itemsize)
        self.max_plans = max_plans  # oldest plans are evicted beyond this many
        self._plans: dict[tuple, CommPlan] = {}
        self._named: dict[tuple, CommPlan] = {}
        self.hits = 0
        self.misses = 0

    def plan(self, moves: Sequence[TensorMove], fused: bool = True, heuristics: bool = True,
             bsr_only: bool = False) -> CommPlan:
        """Plan (or fetch) moving `moves` together. `bsr_only`: one BSR over everything, as Hetu v2 switches graphs."""
        key = (tuple(moves), fused, heuristics, bsr_only)
        plan = self._plans.get(key)
        if plan is None:
            self.misses += 1
            if len(self._plans) >= self.max_plans:
                del self._plans[next(iter(self._plans))]
            plan = self._plans[key] = self.resolver.plan(key[0], fused, heuristics, bsr_only)
        else:
            self.hits += 1
        return plan

    def _named_plan(self, key: tuple, build, fused: bool, heuristics: bool) -> CommPlan:
        key = key + (fused, heuristics)
        plan = self._named.get(key)
        if plan is None:
            if len(self._named) >= self.max_plans:
                del self._named[next(iter(self._named))]
            plan = self._named[key] = self.plan(build(), fused, heuristics, bsr_only=True)
        else:
            self.hits += 1
        return plan

    def switch(self, model: ModelSpec, src: Strategy | StageLayout, dst: Strategy | StageLayout, fused: bool = True,
               heuristics: bool = True) -> CommPlan:
        """Plan moving every parameter from strategy `src` to `dst` (cached by the strategies)."""
        return self._named_plan(("switch", model, src, dst), lambda: switch_moves(model, src, dst), fused, heuristics)

    def pull(self, model: ModelSpec, strategy: Strategy | StageLayout, devices: Sequence[int], fused: bool = True,
             heuristics: bool = True) -> CommPlan:
        devs = tuple(devices)
        return self._named_plan(("pull", model, strategy, devs), lambda: pull_moves(model, strategy, devs), fused,
                                heuristics)

    def push(self, model: ModelSpec, strategy: Strategy | StageLayout, devices: Sequence[int], fused: bool = True,
             heuristics: bool = True) -> CommPlan:
        devs = tuple(devices)
        return self._named_plan(("push", model, strategy, devs), lambda: push_moves(model, strategy, devs), fused,
                                heuristics)


def run(plan: CommPlan, tensors: Sequence[torch.Tensor | None], groups: GroupCache,
        dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> list[torch.Tensor | None]:
    """Execute a (fused) plan on this rank: one batch_isend_irecv with one message per peer, plus any collectives."""
    return execute(plan, tensors, groups, dtype, device)
