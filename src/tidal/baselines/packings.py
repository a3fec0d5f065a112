"""Every packing a `StepPlanner` runs, by name: the planner's own (`hydraulis`: Tidal's packer, planner/packing.py) and
the compared systems'. The runtime, the simulator, the CLI and the library (`tidal.api`) hand `PACKINGS` to the
StepPlanner; the planner itself never imports this layer (decision 106).

- `wlb`: WLB-LLM's packing with the micro-batch count searched per pipeline, behind its outlier-delay queues;
- `wlb-fixed`: the same queues, PP micro-batches per pipeline (PP x DP per step), as its paper ran it;
- `fixed`: token-count first-fit-decreasing to MaxLen (`pack_fixed`), no queues.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

from tidal.baselines import fixed, wlb
from tidal.core.errors import TidalError
from tidal.core.strategy import Strategy
from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.stepper import PLANNER_PACKINGS, Packing, PlanningOptions


@dataclass(frozen=True)
class WLBQueues:
    """WLB-LLM's outlier-delay queues as the stepper's `DelayQueues` (baselines/wlb.py holds them)."""

    def config(self, first: Strategy, coeffs: LatencyCoeffs, mem_len: int, options: PlanningOptions) -> wlb.WLBConfig:
        """WLB's N: micro-batch slots per step. A pipeline needs >= PP micro-batches to fill, so N = the sum of PP
        degrees over the first (best expected) candidate; for one homogeneous pipeline the paper's PP x DP.
        L_max: twice a slot's share of the step's tokens (the bounded-delay guarantee, docs/wlb.md), but not above
        `mem_len`, what memory holds in one micro-batch on the candidate's largest pipeline (WLB-LLM §4.1: what does
        not fit is carried to the next step), nor below the context max_len. Thresholds from the context max_len."""
        if options.max_len < 4:
            raise TidalError(f"{options.packing} packing needs max_len >= 4 (outlier thresholds max_len/4, max_len/2), "
                             f"got {options.max_len}")
        n_slots = sum(p.scheme.pp for p in first.pipelines)
        l_max = min(math.ceil(2 * options.tokens_per_step / n_slots), mem_len)
        return wlb.WLBConfig(n_micro=n_slots, max_len=max(options.max_len, l_max),
                             coeffs=coeffs, thresholds=wlb.default_thresholds(options.max_len))

    def new_state(self) -> wlb.WLBState:
        return wlb.WLBState()

    def load_state(self, d: dict) -> wlb.WLBState:
        """A state from `state_dict()`; {} (a planner without queues saved it) is the empty state."""
        return wlb.WLBState.from_dict(d) if d else wlb.WLBState()

    def step(self, state: wlb.WLBState, seq_ids: Sequence[int], lengths: Sequence[int], cfg: wlb.WLBConfig, *,
             flush: bool = False) -> tuple[wlb.WLBStep, wlb.WLBState]:
        return wlb.wlb_step(state, seq_ids, lengths, cfg, flush=flush)


PACKINGS = MappingProxyType({**PLANNER_PACKINGS, "wlb": Packing(wlb.pack, WLBQueues()),
                             "wlb-fixed": Packing(wlb.pack_fixed_count, WLBQueues()),
                             "fixed": Packing(fixed.pack_fixed)})
