"""HotSPa baseline (as Hydraulis App. G-H configures it): a few homogeneous strategies, one per length bucket, switched
inside each step.

Buckets (Hydraulis App. G): documents below 4K, 4K-16K and 16K-max_len tokens (two strategies at a 16K context, three
at 32K; the same edges at longer contexts). Each bucket's
strategy is the best homogeneous <TP,PP,CP> x DP config (baselines.homogeneous, MaxLen >= the bucket's edge) on the
bucket's share of the first steps. A step runs its buckets shortest first, each FFD-packed to its edge and dealt evenly;
between consecutive buckets every device re-pulls its 16-bit parameters in the new layout and hands its accumulated
16-bit gradients over in the old one (HotSPa's in-step switch, volume over the device's bandwidth, not overlapped).
The first bucket's pull and the last bucket's push are the step's gradient sync, as for every system.
"""

from __future__ import annotations

import time

import numpy as np

from tidal.core.plan import StepPlan
from tidal.simulator import baselines
from tidal.simulator.engine import SimConfig, Simulator, StepResult


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


def run_hotspa(w, sim_cfg: SimConfig, progress):
    from tidal.simulator.systems import STATIC_SAMPLE_STEPS, SystemRun, _steps_of

    t0 = time.perf_counter()
    edges = bucket_edges(w.max_len)
    sample = _steps_of(w.source_factory(), STATIC_SAMPLE_STEPS)
    sim = Simulator(baselines.on_truth(w.cost_model, w.truth), sim_cfg)
    chosen: list[baselines.StaticConfig] = []
    for k, e in enumerate(edges):
        cands = baselines.configs(w.cost_model, e, pack_len=e)
        subs = [x for x in (_split(s, edges)[k] for s in sample) if x.size] or [np.array([e])]
        est = [np.mean([baselines.static_plan(x, c).est_step_time for x in subs]) for c in cands]
        short = sorted(range(len(cands)), key=lambda i: (est[i], i))[:3]
        simt = [np.mean([sim.simulate(baselines.static_plan(x, cands[i]), pull=False, push=False,
                                      optimizer=False).step_time for x in subs]) for i in short]
        chosen.append(cands[short[int(np.argmin(simt))]])
    run = SystemRun("hotspa", " | ".join(f"<={e}: {c.label}" for e, c in zip(edges, chosen)),
                    plan_s=time.perf_counter() - t0)
    for lens in _steps_of(w.source_factory(), w.steps):
        t1 = time.perf_counter()
        plans = [(baselines.static_plan(x, chosen[k]), chosen[k].label)
                 for k, x in enumerate(_split(lens, edges)) if x.size]
        t2 = time.perf_counter()
        parts, sw = [], [0.0]
        for i, (pl, _) in enumerate(plans):
            first, last = i == 0, i == len(plans) - 1
            parts.append(sim.simulate(pl, pull=first, push=last, optimizer=last))
            if not last:
                sw.append(switch_time(sim, pl, plans[i + 1][0]))
        run.steps.append(merge(parts, sw))
        run.switches += len(plans) - 1
        run.sim_s += time.perf_counter() - t2
        run.plan_s += t2 - t1
        run.strategies.append(" > ".join(lb for _, lb in plans))
        run.tokens.append(int(lens.sum()))
        run.est_times.append(sum(p.est_step_time for p, _ in plans))
        if progress:
            progress()
    return run
