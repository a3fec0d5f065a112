"""HotSPa baseline (as Hydraulis App. G-H configures it): a few homogeneous strategies, one per length bucket, switched
inside each step. `strategies`: Hydraulis Table 3's for the scenario (simulator/paper.py), longest bucket first;
without them, each bucket's is searched as below.

Buckets (Hydraulis App. G): documents below 4K, 4K-16K and 16K-max_len tokens (two strategies at a 16K context, three
at 32K; the same edges at longer contexts). Each bucket's
strategy is the best homogeneous <TP,PP,CP> x DP config (baselines.homogeneous, MaxLen >= the bucket's edge) on the
bucket's share of the first steps. A step runs its buckets shortest first, each FFD-packed to its edge and dealt evenly;
between consecutive buckets the strategy switches, not overlapped: priced as Hydraulis measured it (App. H, Table 4;
`paper.HotSPaPricing`, a fixed part plus the model's 16-bit parameters and gradients over one NVLink), or, with
`pricing=None`, by volume (every device re-pulls its 16-bit parameters in the new layout and hands its accumulated
16-bit gradients over in the old one, over the device's bandwidth: a lower bound, 0.05-0.23 s per step).
The first bucket's pull and the last bucket's push are the step's gradient sync, as for every system.
"""

from __future__ import annotations

import time

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import StepPlan
from tidal.simulator import baselines
from tidal.simulator.engine import SimConfig, Simulator, StepResult
from tidal.simulator.paper import HotSPaPricing, PaperConfig, static_config
from tidal.simulator.runs import STATIC_SAMPLE_STEPS, SystemRun, steps_of


def bucket_edges(max_len: int) -> tuple[int, ...]:
    return tuple(e for e in (4096, 16384) if e < max_len) + (max_len,)


def _split(lens: np.ndarray, edges: tuple[int, ...]) -> list[np.ndarray]:
    b = np.searchsorted(np.asarray(edges), lens, side="left")
    return [lens[b == k] for k in range(len(edges))]


def switch_time(sim: Simulator, old: StepPlan, new: StepPlan) -> float:
    """Slowest device's re-pull (new layout) plus gradient hand-over (old layout), over its sync bandwidth."""
    cfg = sim.cfg
    vol = np.zeros(sim.n)
    for plan, per in ((new, cfg.param_bytes), (old, cfg.grad_bytes)):
        for p in plan.pipelines:
            params = sim.stage_params(p)
            n = p.tp * p.cp
            for s in range(p.pp):
                vol[list(p.devices[s * n:(s + 1) * n])] += per * params[s]
    bw = np.array([sim.sync_bw(d) for d in range(sim.n)])
    return float(np.max(vol / bw))


def merge(parts: list[StepResult], switches: list[float]) -> StepResult:
    """One step from consecutive sub-steps (intervals shifted to their start)."""
    t, pipes, traces = 0.0, [], []
    busy = np.zeros_like(parts[0].busy)
    for i, r in enumerate(parts):
        t += switches[i]
        sh = r.shifted(t)
        pipes += list(sh.pipelines)
        traces += list(sh.traces)
        busy += r.busy
        t += r.step_time
    return StepResult(t, t - parts[-1].step_time + parts[-1].compute_time, float(sum(switches)),
                      parts[-1].optimizer_time, tuple(pipes), tuple(traces), busy)


def priced_switch(sim: Simulator, pricing: HotSPaPricing) -> float:
    """One switch under the paper's pricing; the slowest device type's intra-node link carries the model."""
    bw = min(sim.cluster.device_type(d).intra_bw for d in range(sim.n))
    return pricing.switch_s(float(sim.model.num_params()), bw, sim.cfg.comm_eff)


def _searched(w, sim: Simulator, edges: tuple[int, ...]) -> list[baselines.StaticConfig]:
    sample = steps_of(w.source_factory(), STATIC_SAMPLE_STEPS)
    chosen: list[baselines.StaticConfig] = []
    for k, e in enumerate(edges):
        cands = baselines.configs(w.cost_model, e, pack_len=e)
        subs = [x for x in (_split(s, edges)[k] for s in sample) if x.size] or [np.array([e])]
        est = [np.mean([baselines.static_plan(x, c).est_step_time for x in subs]) for c in cands]
        short = sorted(range(len(cands)), key=lambda i: (est[i], i))[:3]
        simt = [np.mean([sim.simulate(baselines.static_plan(x, cands[i]), pull=False, push=False,
                                      optimizer=False).step_time for x in subs]) for i in short]
        chosen.append(cands[short[int(np.argmin(simt))]])
    return chosen


def run_hotspa(w, sim_cfg: SimConfig, progress, *, strategies: tuple[PaperConfig, ...] | None = None,
               pricing: HotSPaPricing | None = None):
    """`strategies`: the paper's, longest bucket first (as Table 3 lists them); None searches each bucket's.
    `pricing`: the paper's switch pricing; None prices a switch by volume (`switch_time`)."""
    t0 = time.perf_counter()
    edges = bucket_edges(w.max_len)
    sim = Simulator(baselines.on_truth(w.cost_model, w.truth), sim_cfg)
    if strategies is not None and len(strategies) != len(edges):
        raise TidalError(f"HotSPa: {len(strategies)} strategies for {len(edges)} length buckets "
                         f"({', '.join(map(str, edges))})")
    if strategies is not None:
        chosen = [static_config(w.cost_model, pc, e) for pc, e in zip(reversed(strategies), edges)]
        source = "Table 3"
    else:
        chosen = _searched(w, sim, edges)
        source = "searched"
    priced = priced_switch(sim, pricing) if pricing is not None else None
    run = SystemRun("hotspa", f"{source}: " + " | ".join(f"<={e}: {c.label}" for e, c in zip(edges, chosen))
                    + (f"; {priced:.2f} s per switch (App. H)" if priced is not None else "; switch by volume"),
                    plan_s=time.perf_counter() - t0)
    for lens in steps_of(w.source_factory(), w.steps):
        t1 = time.perf_counter()
        plans = [(baselines.static_plan(x, chosen[k]), chosen[k].label)
                 for k, x in enumerate(_split(lens, edges)) if x.size]
        t2 = time.perf_counter()
        parts, sw = [], [0.0]
        for i, (pl, _) in enumerate(plans):
            first, last = i == 0, i == len(plans) - 1
            parts.append(sim.simulate(pl, pull=first, push=last, optimizer=last))
            if not last:
                sw.append(priced if priced is not None else switch_time(sim, pl, plans[i + 1][0]))
        run.steps.append(merge(parts, sw))
        run.switches += len(plans) - 1
        run.switch_s.append(float(sum(sw)))
        run.sim_s += time.perf_counter() - t2
        run.plan_s += t2 - t1
        run.strategies.append(" > ".join(lb for _, lb in plans))
        run.tokens.append(int(lens.sum()))
        run.est_times.append(sum(p.est_step_time for p, _ in plans))
        if progress:
            progress()
    return run
