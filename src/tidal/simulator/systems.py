"""The compared systems, each configured as its paper's evaluation (docs/simulator.md cites the sections).

`run_system(name, workload, ...)` plans `workload.steps` steps of the workload's data with the system's planner and
simulates every step. Planner-based systems (tidal, hydraulis, wlb) use `tidal.planner.stepper.StepPlanner` over a
fresh step source from `workload.source_factory` (the CLI builds `tidal.data.TokenBudgetSampler`s; this layer cannot
import `tidal.data`), so every system sees the same documents in the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from types import MappingProxyType

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import StepPlan
from tidal.costmodel.base import CostModel
from tidal.planner.proposal import propose, scheme_space
from tidal.planner.stepper import PlanningOptions, StepPlanner, StepSource, build_candidates
from tidal.simulator import baselines
from tidal.simulator.engine import SimConfig, Simulator, StepResult

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


def _steps_of(source: StepSource, n: int) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        st = source.next_step()
        if st is None:
            break
        out.append(np.asarray(st.lengths, dtype=np.int64))
    if not out:
        raise TidalError("the data source produced no step")
    return out


def _label(step: StepPlan) -> str:
    from tidal.core.scheme import ParallelScheme, format_strategy

    return format_strategy(tuple(ParallelScheme(p.tp, p.pp, p.cp) for p in step.pipelines))


def _simulator(w: Workload, sim: SimConfig, cm: CostModel | None = None, **over) -> Simulator:
    """A simulator executing on the workload's truth (under `cm`'s baseline techniques), else on `cm` itself."""
    return Simulator(baselines.on_truth(cm or w.cost_model, w.truth), replace(sim, **over) if over else sim)


def best_static(w: Workload, sim: SimConfig, *, ulysses: bool = False, cp_mode: str = "per-seq"
                ) -> baselines.StaticConfig:
    """The fastest homogeneous config on the first STATIC_SAMPLE_STEPS steps: all feasible configs ranked by the
    planner's estimate, the best STATIC_SHORTLIST simulated."""
    cands = baselines.configs(w.cost_model, w.max_len, ulysses=ulysses, cp_mode=cp_mode)
    sample = _steps_of(w.source_factory(), STATIC_SAMPLE_STEPS)
    est = [np.mean([baselines.static_plan(s, c).est_step_time for s in sample]) for c in cands]
    short = [cands[i] for i in sorted(range(len(cands)), key=lambda i: (est[i], i))[:STATIC_SHORTLIST]]
    sims = []
    for c in short:
        s = _simulator(w, sim, c.cost_model, pulls_per_step=2 if ulysses else sim.pulls_per_step)
        sims.append(np.mean([s.simulate(baselines.static_plan(x, c), sync_group=c.dp).step_time for x in sample]))
    return short[int(np.argmin(sims))]


def run_static(name: str, w: Workload, sim: SimConfig, cfg: baselines.StaticConfig, progress: Progress,
               *, ulysses: bool = False, t_plan: float = 0.0) -> SystemRun:
    run = SystemRun(name, cfg.label, plan_s=t_plan)
    s = _simulator(w, sim, cfg.cost_model, pulls_per_step=2 if ulysses else sim.pulls_per_step)
    for lens in _steps_of(w.source_factory(), w.steps):
        t0 = time.perf_counter()
        plan = baselines.static_plan(lens, cfg)
        t1 = time.perf_counter()
        run.steps.append(s.simulate(plan, sync_group=cfg.dp))
        run.sim_s += time.perf_counter() - t1
        run.plan_s += t1 - t0
        run.strategies.append(cfg.label)
        run.tokens.append(int(lens.sum()))
        run.est_times.append(plan.est_step_time)
        if progress:
            progress()
    return run


def run_planner(name: str, w: Workload, sim: SimConfig, candidates, options: PlanningOptions, progress: Progress,
                *, config: str, t_plan: float = 0.0) -> SystemRun:
    run = SystemRun(name, config, plan_s=t_plan)
    planner = StepPlanner(w.cost_model, candidates, w.source_factory(), options)
    s = _simulator(w, sim)
    prev = None
    for ps in chain(planner.steps(w.steps), planner.flush()):
        run.plan_s += ps.plan.plan_ms / 1e3
        t1 = time.perf_counter()
        plan = ps.plan
        if not any(p.micro_batches for p in plan.pipelines):
            continue
        run.steps.append(s.simulate(plan))
        run.sim_s += time.perf_counter() - t1
        run.strategies.append(_label(plan))
        run.switches += int(prev is not None and prev != plan.strategy)
        prev = plan.strategy
        run.tokens.append(int(sum(plan.seq_lengths[i] for p in plan.pipelines for mb in p.micro_batches for i in mb)))
        run.est_times.append(plan.est_step_time)
        if progress:
            progress()
    return run


def _options(w: Workload, **kw) -> PlanningOptions:
    return PlanningOptions(max_len=w.max_len, tokens_per_step=w.tokens_per_step, seed=w.seed, **kw)


def sys_megatron(w, sim, progress):
    t0 = time.perf_counter()
    cfg = best_static(w, sim)
    return run_static("megatron", w, sim, cfg, progress, t_plan=time.perf_counter() - t0)


def sys_deepspeed(w, sim, progress):
    t0 = time.perf_counter()
    cfg = best_static(w, sim, ulysses=True)
    return run_static("deepspeed", w, sim, cfg, progress, ulysses=True, t_plan=time.perf_counter() - t0)


def sys_wlb(w, sim, progress):
    t0 = time.perf_counter()
    cfg = best_static(w, sim, cp_mode="adaptive")
    return run_planner("wlb", w, sim, [cfg.strategy], _options(w, packing="wlb", cp_sharding="adaptive"), progress,
                       config=f"{cfg.label}, var-len packing + delay, adaptive CP", t_plan=time.perf_counter() - t0)


def sys_hydraulis(w, sim, progress):
    t0 = time.perf_counter()
    cm = w.cost_model
    space = scheme_space(cm, cm.cluster.num_devices, max_cp=1)
    cands = propose(np.minimum(w.sample_lengths, w.max_len), cm, tokens_per_step=w.tokens_per_step,
                    max_len=w.max_len, schemes=space, seed=w.seed).strategies
    return run_planner("hydraulis", w, sim, cands, _options(w, packing="hydraulis"), progress,
                       config=" ; ".join(str(c) for c in cands), t_plan=time.perf_counter() - t0)


def sys_tidal(w, sim, progress):
    t0 = time.perf_counter()
    cands = build_candidates(w.cost_model, "auto", w.sample_lengths, tokens_per_step=w.tokens_per_step,
                             max_len=w.max_len, seed=w.seed)
    return run_planner("tidal", w, sim, cands, _options(w, packing="hydraulis", cp_sharding="adaptive"), progress,
                       config=" ; ".join(str(c) for c in cands), t_plan=time.perf_counter() - t0)


def sys_flexpipe(w, sim, progress):
    from tidal.simulator.flexpipe import run_flexpipe

    return run_flexpipe(w, sim, progress)


def sys_hotspa(w, sim, progress):
    from tidal.simulator.hotspa import run_hotspa

    return run_hotspa(w, sim, progress)


SYSTEMS = MappingProxyType({
    "megatron": sys_megatron, "deepspeed": sys_deepspeed, "hotspa": sys_hotspa, "wlb": sys_wlb,
    "hydraulis": sys_hydraulis, "tidal": sys_tidal, "flexpipe": sys_flexpipe,
})


def parse_systems(text: str) -> tuple[str, ...]:
    names = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SYSTEMS]
    if bad or not names:
        raise TidalError(f"unknown system(s) {', '.join(bad) or text!r}; choose from {', '.join(SYSTEMS)}")
    return tuple(dict.fromkeys(names))


def run_system(name: str, w: Workload, sim: SimConfig | None = None, progress: Progress = None) -> SystemRun:
    if name not in SYSTEMS:
        raise TidalError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    return SYSTEMS[name](w, sim or SimConfig(), progress)


def speedups(runs: Sequence[SystemRun]) -> dict[str, float]:
    """tokens/s of every system over the best static baseline's (the faster of megatron and deepspeed)."""
    static = [r.tokens_per_s for r in runs if r.name in ("megatron", "deepspeed")]
    if not static or max(static) <= 0:
        return {}
    best = max(static)
    return {r.name: r.tokens_per_s / best for r in runs}
