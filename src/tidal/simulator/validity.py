"""Simulated vs measured step time of real training steps (docs/simulator.md, "Simulator validity").

`tidal train` writes one metrics row per step (docs/training.md); its plan is re-made by the same deterministic
`StepPlanner` and simulated here with the cost model the run planned with. What is compared, like with like:

* **busy**: the simulator's per-device compute seconds (`StepResult.busy`, forward + backward operations only,
  bubbles excluded) against the row's `compute_busy_s` (each rank's forward + backward CPU time). Per step: the max
  over devices vs `measured_s` (max over ranks); per pipeline: the max over its devices vs the pipeline's
  `measured_s`. On CPU a rank waiting on a receive or a collective uses no CPU (docs/decisions.md 40), so this is
  the quantity the runtime measures; pull, push and the optimizer are in neither figure.
* **makespan**: the simulator's last backward end (`StepResult.compute_time`, with pipeline bubbles and P2P) against
  the same `measured_s`, to show what bubbles add where they are waiting, not work (PP > 1).

A row is only compared with a plan whose features (per pipeline with work: micro-batches, Σl, Σl²) equal the row's,
so a re-planned step that differs from the trained one is an error, not a silent mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import StepPlan
from tidal.simulator.engine import Simulator


@dataclass(frozen=True)
class SimulatedStep:
    busy_s: float  # max over devices of simulated forward + backward seconds (bubbles excluded)
    makespan_s: float  # last backward end: busy plus bubbles and P2P waits
    pipelines_busy_s: tuple[float, ...]  # per pipeline with work: max over its devices of its own busy seconds
    stages_busy_s: tuple[tuple[float, ...], ...]  # per pipeline with work: busy seconds of each stage
    stage_ranks: tuple[tuple[tuple[int, ...], ...], ...]  # per pipeline with work: the devices of each stage


def simulate_compute(sim: Simulator, step: StepPlan) -> SimulatedStep:
    """Simulate a step's forward and backward only (no pull, push or optimizer: not in `compute_busy_s`)."""
    res = sim.simulate(step, pull=False, push=False, optimizer=False)
    pipes, stages, ranks = [], [], []
    for p, t in zip(res.pipelines, res.traces):
        if not p.micro_batches:
            continue
        per_stage = np.bincount(t.stage, weights=t.end - t.start, minlength=p.pp)
        pipes.append(float(per_stage.max()))
        stages.append(tuple(float(x) for x in per_stage))
        n = p.tp * p.cp
        ranks.append(tuple(tuple(p.devices[s * n:(s + 1) * n]) for s in range(p.pp)))
    return SimulatedStep(float(res.busy.max()), float(res.compute_time), tuple(pipes), tuple(stages), tuple(ranks))


def plan_features(step: StepPlan) -> list[tuple[int, int, int]]:
    """(micro-batches, Σl, Σl²) of every pipeline with work, in plan order (the rows' `pipelines` order)."""
    out = []
    for p in step.pipelines:
        if p.micro_batches:
            ls = [step.seq_lengths[i] for mb in p.micro_batches for i in mb]
            out.append((len(p.micro_batches), int(sum(ls)), int(sum(x * x for x in ls))))
    return out


def check_row_matches(row: dict, step: StepPlan, where: str = "row") -> None:
    """Raise TidalError unless the metrics row trained exactly this plan's pipelines (same features, same order)."""
    got = [(int(q["micro_batches"]), int(q["sum_len"]), int(q["sum_sq"])) for q in row["pipelines"]]
    want = plan_features(step)
    if got != want:
        raise TidalError(f"{where}: re-planned step differs from the trained one: plan {want}, metrics {got}")


def rel_errors(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """|simulated - measured| / measured over (simulated, measured) pairs with measured > 0."""
    return np.array([abs(s - m) / m for s, m in pairs if m > 0], dtype=np.float64)


def error_stats(pairs: Sequence[tuple[float, float]]) -> dict:
    """n, median, p90 and worst of |sim - meas| / meas, and bias = median(sim / meas) - 1."""
    err = rel_errors(pairs)
    if err.size == 0:
        raise TidalError("no pair with a measured time > 0")
    ratio = np.array([s / m for s, m in pairs if m > 0])
    return {"n": int(err.size), "median": float(np.median(err)), "p90": float(np.percentile(err, 90)),
            "worst": float(err.max()), "bias": float(np.median(ratio) - 1.0)}
