"""The compared systems, each configured as its paper's evaluation (docs/simulator.md cites the sections).

`run_system(name, workload, ...)` plans `workload.steps` steps of the workload's data with the system's planner and
simulates every step. Planner-based systems (tidal, hydraulis, wlb) use `tidal.planner.stepper.StepPlanner` over a
fresh step source from `workload.source_factory` (the CLI builds `tidal.data.TokenBudgetSampler`s; this layer cannot
import `tidal.data`), so every system sees the same documents in the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from itertools import chain
from types import MappingProxyType

import numpy as np

from tidal.baselines.packings import PACKINGS
from tidal.core.errors import TidalError
from tidal.costmodel.base import CostModel
from tidal.planner.proposal import propose, scheme_space
from tidal.planner.stepper import PlanningOptions, StepPlanner, build_candidates
from tidal.simulator import baselines, paper
from tidal.simulator.engine import SimConfig, Simulator
from tidal.simulator.flexpipe import run_flexpipe
from tidal.simulator.hotspa import run_hotspa
from tidal.simulator.runs import STATIC_SAMPLE_STEPS, STATIC_SHORTLIST, Progress, SystemRun, Workload, label, steps_of

__all__ = ["STATIC_SAMPLE_STEPS", "STATIC_SHORTLIST", "SYSTEMS", "SystemRun", "Workload", "best_static",
           "parse_systems", "run_system", "speedups"]

HYDRAULIS_MAX_TP = 16  # Hydraulis' profiled pools (../shared/data/hydraulis-profiles) go to TP16 (7b, 32b)
HYDRAULIS_MAX_PP = 8


def _simulator(w: Workload, sim: SimConfig, cm: CostModel | None = None, **over) -> Simulator:
    """A simulator executing on the workload's truth (under `cm`'s baseline techniques), else on `cm` itself."""
    return Simulator(baselines.on_truth(cm or w.cost_model, w.truth), replace(sim, **over) if over else sim)


def best_static(w: Workload, sim: SimConfig, *, ulysses: bool = False, cp_mode: str = "per-seq"
                ) -> baselines.StaticConfig:
    """The fastest homogeneous config on the first STATIC_SAMPLE_STEPS steps: all feasible configs ranked by the
    planner's estimate, the best STATIC_SHORTLIST simulated."""
    cands = baselines.configs(w.cost_model, w.max_len, ulysses=ulysses, cp_mode=cp_mode)
    sample = steps_of(w.source_factory(), STATIC_SAMPLE_STEPS)
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
    for lens in steps_of(w.source_factory(), w.steps):
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
                *, config: str, t_plan: float = 0.0, charged: bool = False, eq1: bool = False) -> SystemRun:
    """`charged`: the planner charges the pull/push and CP imbalance as `sim` executes them (Tidal's planner; the
    papers' planners do not). `eq1`: one-stage pipelines priced by Hydraulis Eq. 1 (the Hydraulis baseline)."""
    run = SystemRun(name, config, plan_s=t_plan)
    planner = StepPlanner(w.cost_model, candidates, w.source_factory(), options,
                          sync=sim.sync if charged else None, charge_cp=charged, eq1=eq1, packings=PACKINGS)
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
        run.strategies.append(label(plan))
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


def _table3(w: Workload):
    cm = w.cost_model
    return paper.table3(cm.model, cm.cluster.num_devices, w.max_len)


def sys_megatron_paper(w, sim, progress):
    """Megatron-LM with Hydraulis Table 3's configuration of the scenario (simulator/paper.py)."""
    cfg = paper.static_config(w.cost_model, _table3(w)[1], w.max_len)
    return run_static("megatron-paper", w, sim, cfg, progress)


def sys_deepspeed_paper(w, sim, progress):
    """DeepSpeed (Ulysses x DP, ZeRO-3, "+ AC" as listed) with Hydraulis Table 3's configuration of the scenario."""
    cfg = paper.static_config(w.cost_model, _table3(w)[0], w.max_len)
    return run_static("deepspeed-paper", w, sim, cfg, progress, ulysses=True)


def sys_wlb(w, sim, progress):
    """WLB-LLM as its paper ran it: one homogeneous 4D strategy (the best static), variable-length packing with
    outlier delay into a fixed PP x DP micro-batches per step (`wlb-fixed`), adaptive CP sharding."""
    t0 = time.perf_counter()
    cfg = best_static(w, sim, cp_mode="adaptive")
    return run_planner("wlb", w, sim, [cfg.strategy], _options(w, packing="wlb-fixed", cp_sharding="adaptive"),
                       progress, config=f"{cfg.label}, var-len packing + delay into PP x DP micro-batches, adaptive CP",
                       t_plan=time.perf_counter() - t0)


def hydraulis_schemes(cm: CostModel):
    """Hydraulis' scheme pool: <TP, PP> with CP = 1, TP up to 16 (across two nodes, as in its profiled pools), PP up
    to 8."""
    return scheme_space(cm, max_tp=min(HYDRAULIS_MAX_TP, cm.cluster.num_devices), max_cp=1,
                        max_pp=HYDRAULIS_MAX_PP)


def sys_hydraulis(w, sim, progress):
    t0 = time.perf_counter()
    cm = w.cost_model
    cands = propose(np.minimum(w.sample_lengths, w.max_len), cm, tokens_per_step=w.tokens_per_step,
                    max_len=w.max_len, schemes=hydraulis_schemes(cm), seed=w.seed).strategies
    return run_planner("hydraulis", w, sim, cands, _options(w, packing="hydraulis"), progress,
                       config=" ; ".join(str(c) for c in cands), t_plan=time.perf_counter() - t0, eq1=True)


def sys_tidal(w, sim, progress, *, charged: bool = True, name: str = "tidal"):
    """Tidal: the proposal and the per-step selection charge the pull/push and CP imbalance as `sim` executes them
    (decision 86); `tidal-nocharge` is the same planner without those charges (the ablation). Its scheme space
    holds Hydraulis' (TP up to 16, across two nodes) and adds CP."""
    t0 = time.perf_counter()
    if w.tidal is not None:  # a training job's own candidates and planning options (tidal simulate --config)
        cands, options = w.tidal
        return run_planner(name, w, sim, cands, options, progress, config=" ; ".join(str(c) for c in cands),
                           t_plan=time.perf_counter() - t0, charged=charged)
    cm = w.cost_model
    space = scheme_space(cm, max_tp=min(HYDRAULIS_MAX_TP, cm.cluster.num_devices))
    cands = build_candidates(cm, "auto", w.sample_lengths, tokens_per_step=w.tokens_per_step,
                             max_len=w.max_len, seed=w.seed, sync=sim.sync if charged else None,
                             cp_policy="adaptive" if charged else None, schemes=space, refine=True)
    return run_planner(name, w, sim, cands, _options(w, packing="hydraulis", cp_sharding="adaptive"), progress,
                       config=" ; ".join(str(c) for c in cands), t_plan=time.perf_counter() - t0, charged=charged)


def sys_tidal_nocharge(w, sim, progress):
    return sys_tidal(w, sim, progress, charged=False, name="tidal-nocharge")


def sys_flexpipe(w, sim, progress):
    return run_flexpipe(w, sim, progress)


def sys_hotspa(w, sim, progress):
    """HotSPa as Hydraulis ran it: Table 3's strategies where the paper lists the scenario (searched otherwise),
    switching priced as App. H / Table 4 measured it (paper.HotSPaPricing)."""
    try:
        listed = _table3(w)[2]
    except TidalError:
        listed = None
    return run_hotspa(w, sim, progress, strategies=listed, pricing=paper.HotSPaPricing())


SYSTEMS = MappingProxyType({
    "megatron": sys_megatron, "deepspeed": sys_deepspeed, "megatron-paper": sys_megatron_paper,
    "deepspeed-paper": sys_deepspeed_paper, "hotspa": sys_hotspa, "wlb": sys_wlb, "hydraulis": sys_hydraulis,
    "tidal": sys_tidal, "flexpipe": sys_flexpipe,
})
# run by name (`run_system`, `--systems`) but not among the compared systems: ablations of one of them
ABLATIONS = MappingProxyType({"tidal-nocharge": sys_tidal_nocharge})
STATIC_SYSTEMS = ("megatron", "deepspeed", "megatron-paper", "deepspeed-paper")


def parse_systems(text: str) -> tuple[str, ...]:
    names = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SYSTEMS and s not in ABLATIONS]
    if bad or not names:
        raise TidalError(f"unknown system(s) {', '.join(bad) or text!r}; choose from {', '.join(SYSTEMS)}"
                         f" (ablations: {', '.join(ABLATIONS)})")
    return tuple(dict.fromkeys(names))


def run_system(name: str, w: Workload, sim: SimConfig | None = None, progress: Progress = None) -> SystemRun:
    fn = SYSTEMS.get(name) or ABLATIONS.get(name)
    if fn is None:
        raise TidalError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)} (ablations: "
                         f"{', '.join(ABLATIONS)})")
    return fn(w, sim or SimConfig(), progress)


def speedups(runs: Sequence[SystemRun], baseline_names: Sequence[str] = STATIC_SYSTEMS) -> dict[str, float]:
    """tokens/s of every system over the best baseline's: by default the fastest static one (megatron, deepspeed and
    their Table-3 configurations, whichever ran); Hydraulis Fig. 13 compares to the best of megatron-paper,
    deepspeed-paper and hotspa."""
    static = [r.tokens_per_s for r in runs if r.name in baseline_names]
    if not static or max(static) <= 0:
        return {}
    best = max(static)
    return {r.name: r.tokens_per_s / best for r in runs}
