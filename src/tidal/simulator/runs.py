"""What every compared system shares: the workload it runs, the record of its run, and the step stream.

Kept apart from `systems` (which dispatches to every system) so that the systems in their own modules (hotspa,
flexpipe) import these without importing `systems` back: no import cycle (issue 27).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import StepPlan
from tidal.core.scheme import ParallelScheme, format_strategy
from tidal.costmodel.base import CostModel
from tidal.planner.stepper import StepSource
from tidal.simulator.engine import StepResult

STATIC_SAMPLE_STEPS = 2  # steps used to pick the best static config
STATIC_SHORTLIST = 3  # configs (best by planner estimate) that are simulated to pick the best


@dataclass(frozen=True)
class Workload:
    cost_model: CostModel
    max_len: int
    tokens_per_step: int
    steps: int
    seed: int
    source_factory: Callable[[], StepSource]  # a fresh source at the start of the data
    sample_lengths: np.ndarray = field(repr=False)  # document lengths the proposal plans from
    # The device model plans execute on (decision 77; `tidal simulate --truth`); None: the planner's own cost model.
    # Planners never see it: they plan with `cost_model` (a baseline's Variant of it); the simulator runs `truth`.
    truth: CostModel | None = None
    # A training job's (candidates, PlanningOptions) (`tidal simulate --config`): the tidal system plans with them
    # instead of proposing its own; None: proposed from `sample_lengths`, Hydraulis packing, adaptive CP.
    tidal: tuple | None = None


@dataclass
class SystemRun:
    name: str
    config: str
    steps: list[StepResult] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)  # strategy label per step (Fig. 15a)
    tokens: list[int] = field(default_factory=list)  # tokens run per step
    est_times: list[float] = field(default_factory=list)  # planner estimate per step
    plan_s: float = 0.0  # planning wall time (proposal/search included)
    sim_s: float = 0.0  # simulation wall time
    switches: int = 0  # strategy changes between or inside steps
    decision_ms: list[float] = field(default_factory=list)  # per-step planning decision time (FlexPipe's HBSA)
    switch_s: list[float] = field(default_factory=list)  # per-step strategy-switching seconds (HotSPa)

    @property
    def step_times(self) -> list[float]:
        return [r.step_time for r in self.steps]

    @property
    def mean_step_time(self) -> float:
        return float(np.mean(self.step_times)) if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        t = float(np.sum(self.step_times))
        return float(np.sum(self.tokens)) / t if t > 0 else 0.0


Progress = Callable[[], None] | None


def steps_of(source: StepSource, n: int) -> list[np.ndarray]:
    """The lengths of the first `n` steps of a source."""
    out = []
    for _ in range(n):
        st = source.next_step()
        if st is None:
            break
        out.append(np.asarray(st.lengths, dtype=np.int64))
    if not out:
        raise TidalError("the data source produced no step")
    return out


def label(step: StepPlan) -> str:
    """The strategy a step ran, as `tidal.core.scheme.format_strategy` writes it."""
    return format_strategy(tuple(ParallelScheme(p.tp, p.pp, p.cp) for p in step.pipelines))
