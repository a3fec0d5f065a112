"""FlexPipe baseline (flexpipe.txt §4-5, §7.1): one pipeline, TP = CP = 1, its mapping re-decided every step by
`tidal.baselines.flexpipe.FlexPipePlanner` (HBSA), with its reconfiguration (layer migration) and recomputation
costs.

A step: documents FFD-packed into about MICRO_BATCHES micro-batches (capacity: the larger of the step's longest
document mu and tokens / MICRO_BATCHES); the HBSA decision for them; each stage's micro-batch split over its GPUs
(longest-first onto the least-loaded GPU; the stage waits for its slowest GPU); 1F1B over the stages with P2P between
the first GPUs of consecutive groups; each stage's data-parallel gradient all-reduce after its last backward
(overlapped as the engine's push); reconfiguration time before the step. `static=True` holds the mapping HBSA picks
for micro-batches of one context-length document (the best static PP, no reconfiguration).
"""

from __future__ import annotations

import time

import numpy as np

from tidal.baselines.fixed import pack_fixed
from tidal.baselines.flexpipe import FlexPipePlanner, Mapping, WorkloadMemory
from tidal.core.plan import PipelinePlan
from tidal.simulator.baselines import UNIT, on_truth
from tidal.simulator.engine import BWD, PipelineTrace, SimConfig, Simulator, StepResult, run_pipeline
from tidal.simulator.runs import SystemRun, steps_of

MICRO_BATCHES = 8  # a step's documents are packed into about this many micro-batches (at least the longest document)


def _split_time(work: np.ndarray, g: int) -> float:
    """Longest-first onto the least-loaded of g GPUs; the largest load."""
    loads = np.zeros(g)
    for w in np.sort(work)[::-1]:
        loads[int(np.argmin(loads))] += w
    return float(loads.max())


def simulate_mapping(sim: Simulator, mp: Mapping, recompute, lengths: np.ndarray, mbs, switch: float,
                     stage_overhead_s: float = 0.0) -> StepResult:
    """One step on mapping `mp`; `stage_overhead_s` is added to every stage's forward + backward of each micro-batch
    (`FlexPipePlanner.stage_overhead_s`), split between them as the compute is."""
    cfg, m = sim.cfg, sim.model
    groups = mp.device_groups()
    dev = [sim.cluster.device_type(g[0]) for g in groups]
    v, S = len(mbs), mp.stages
    fb = np.zeros((S, v))
    toks = np.array([lengths[list(mb)].sum() for mb in mbs], dtype=np.float64)
    for s in range(S):
        k = sim.stage_coeffs(1, 1, mp.layers[s], s == S - 1, dev[s])
        for j, mb in enumerate(mbs):
            ls = lengths[list(mb)].astype(np.float64)
            work = _split_time(k.a * ls * ls + k.b * ls + k.d, mp.gpus[s])
            fb[s, j] = (k.c + work) * (1 + recompute[s] * cfg.fwd_share) + stage_overhead_s
    p2p = np.zeros((max(S - 1, 0), v))
    for s in range(S - 1):
        bw = sim._bw(groups[s][0], groups[s + 1][0])
        p2p[s] = toks * 2.0 * m.hidden / bw
    fwd, bwd = fb * cfg.fwd_share, fb * (1 - cfg.fwd_share)
    st, mbi, kind, start, end = run_pipeline(fwd, bwd, p2p, np.zeros(S), cfg.schedule)
    busy = np.zeros(sim.n)
    sync_end = np.zeros(S)
    for s in range(S):
        params = mp.layers[s] * m.layer_params()
        g = mp.gpus[s]
        push = 2 * (g - 1) / g * cfg.grad_bytes * params / sim.sync_bw(groups[s][0]) if g > 1 else 0.0
        i = int(np.flatnonzero((st == s) & (kind == BWD))[-1])
        d, L = end[i] - start[i], mp.layers[s]
        sync_end[s] = start[i] + max(d / L + push, d + push / L) if push > 0 else end[i]
        busy[list(groups[s])] += float(np.sum(end[st == s] - start[st == s]))
    opt = max(mp.layers) * m.layer_params() * cfg.optimizer_bytes_per_param / sim.hbm_bw
    plan = PipelinePlan(1, S, 1, tuple(g[0] for g in groups), 0, tuple(tuple(int(i) for i in mb) for mb in mbs), 0.0,
                        (), mp.layers)
    tr = PipelineTrace(st, mbi, kind, start + switch, end + switch, np.full(S, switch), sync_end + switch)
    total = switch + max(float(sync_end.max()), tr.finish - switch) + opt
    return StepResult(total, tr.finish, switch, opt, (plan,), (tr,), busy)


def run_flexpipe(w, sim_cfg: SimConfig, progress, *, static: bool = False, name: str = "flexpipe",
                 workload_memory: WorkloadMemory | None = None, stage_overhead_s: float = 0.0,
                 memopt_share: float = 1.0):
    """`workload_memory`: FlexPipe's own memory model of its workload (`tidal.baselines.flexpipe.fit_table2`);
    None sizes stages with Tidal's memory model. `stage_overhead_s`: FlexPipe's per-stage overhead of each micro-batch
    operation (`flexpipe.fit_fig2c`), planned and executed alike; `memopt_share`: the most of a stage's bytes its
    memory optimisation may save (`flexpipe.TABLE2_MEMOPT_SHARE`)."""
    t0 = time.perf_counter()
    planner = FlexPipePlanner(w.cost_model, fwd_share=sim_cfg.fwd_share, workload_memory=workload_memory,
                              stage_overhead_s=stage_overhead_s, memopt_share=memopt_share)
    sim = Simulator(on_truth(w.cost_model, w.truth), sim_cfg)
    fixed = None
    if static:
        # the mapping for the worst case: micro-batches of one context-length document
        cap = max(w.max_len, -(-w.tokens_per_step // MICRO_BATCHES))
        n_mb = max(1, -(-w.tokens_per_step // cap))
        n = planner.n_stage(w.max_len, float(cap))
        fixed = planner.search(n, w.max_len, float(cap), float(w.max_len) ** 2, n_mb, None)[0] or planner.even(n)
    run = SystemRun(name, "", plan_s=time.perf_counter() - t0)
    current = fixed
    decisions: list[str] = []
    search_ms: list[float] = []
    for lens in steps_of(w.source_factory(), w.steps):
        t1 = time.perf_counter()
        mu = int(lens.max())
        mbs = pack_fixed(lens, UNIT, 1, max(mu, -(-int(lens.sum()) // MICRO_BATCHES))).micro_batches
        s1 = float(lens.sum()) / len(mbs)
        s2 = float(np.sum(lens.astype(np.float64) ** 2)) / len(mbs)
        if static:
            rc = planner.o_plan(fixed, mu, s1) or planner.o_plan(fixed, mu, s1, capped=False)
            mp, rc, sw = fixed, rc or (0.0,) * fixed.stages, 0.0
            decisions.append("static")
        else:
            dec = planner.decide(mu, s1, s2, len(mbs), current)
            mp, rc, sw = dec.mapping, dec.recompute, dec.switch_time
            run.switches += int(current is not None and mp != current)
            decisions.append(dec.action)
            search_ms.append(dec.search_ms)
            current = mp
        t2 = time.perf_counter()
        run.steps.append(simulate_mapping(sim, mp, rc, lens, mbs, sw, stage_overhead_s))
        run.sim_s += time.perf_counter() - t2
        run.plan_s += t2 - t1
        run.strategies.append("pp" + ",".join(f"{n}x{g}" for n, g in zip(mp.layers, mp.gpus)))
        run.tokens.append(int(lens.sum()))
        run.est_times.append(planner.pipeline_time(mp, s1, s2, len(mbs), rc, mu))
        if progress:
            progress()
    acts = {a: decisions.count(a) for a in dict.fromkeys(decisions)}
    run.config = ("static " if static else "HBSA ") + ", ".join(f"{a} {n}" for a, n in acts.items())
    if search_ms:
        run.config += f"; HBSA median {np.median(search_ms):.1f} ms/decision"
    run.decision_ms = search_ms
    return run

