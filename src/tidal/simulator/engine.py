"""Discrete-event execution of one step's plan on a modelled cluster (docs/simulator.md).

Every pipeline of a `StepPlan` runs its micro-batches through its PP stages under 1F1B or GPipe. A stage is one
resource (its TP x CP devices run in lock step); an operation (forward or backward of one micro-batch on one stage)
starts when its stage is free, its predecessors are done and their P2P transfer has arrived. Operations leave a
priority queue keyed by (start time, stage, operation id), so ties break the same way on every run.

Times:
- stage s of a pipeline holds L_s layers on its slowest device type; its micro-batch time is c + sum(a l^2 + b l)
  with per-stage coefficients from the cost model (`stage_coeffs`: per-layer slope times L_s, the LM head on the last
  stage; TP and CP collectives are inside the coefficients, PP transfers are not);
- CP > 1: the attention term is scaled by the slowest CP rank under the micro-batch's sharding mode (kernel model of
  `tidal.costmodel.kernel`), relative to a perfect 1/CP split; "heads" (Ulysses) splits heads and is balanced;
- forward : backward = fwd_share : (1 - fwd_share) of the micro-batch time (default 1:2);
- P2P: 2 bytes x hidden per token, divided over the TP x CP ranks, over the link between the two stages;
- gradient sync (Hydraulis §5.2, Fig. 11): before the step each device pulls its 16-bit shard of the parameters from
  the owners of the fully sharded optimizer state, after its last backward it pushes the gradients back; layer by
  layer, so the pull overlaps the first forward and the push overlaps the last backward (`overlap_sync`);
- the optimizer step updates 1/N of the parameters per device at `hbm_bw` once every push has arrived.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from tidal.core.cluster import DeviceType
from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.base import CostModel, LatencyCoeffs
from tidal.costmodel.fitted import FittedCostModel
from tidal.costmodel.sync import SyncPricing, exposed, stage_params, sync_bandwidth, sync_seconds
from tidal.planner.cp_adaptive import cp_imbalance, cp_kernel

SCHEDULES = ("1f1b", "gpipe")
FWD, BWD = 0, 1


@dataclass(frozen=True)
class SimConfig:
    schedule: str = "1f1b"
    fwd_share: float = 1.0 / 3.0  # forward share of forward + backward (1:2)
    overlap_sync: bool = True  # layer-wise pull/push overlapped with the first forward / last backward
    param_bytes: float = 2.0  # 16-bit parameters pulled per step
    grad_bytes: float = 2.0  # 16-bit gradients pushed per step
    pulls_per_step: int = 1  # ZeRO-3 gathers parameters for forward and again for backward: 2
    comm_eff: float = 0.8  # achieved / nominal link bandwidth
    optimizer_bytes_per_param: float = 32.0  # fp32 master, Adam m, v, fp32 gradient: read + write
    hbm_bw: float | None = None  # bytes/s of device memory for the optimizer update; None: the slowest device type's
    cp_imbalance: bool = True  # charge the slowest CP rank under the kernel model (False: perfect 1/CP split)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise TidalError(f"unknown schedule {self.schedule!r}; choose {' or '.join(SCHEDULES)}")
        if not 0 < self.fwd_share < 1:
            raise TidalError(f"fwd_share must be in (0, 1), got {self.fwd_share}")
        if not 0 < self.comm_eff <= 1 or (self.hbm_bw is not None and self.hbm_bw <= 0) or self.pulls_per_step < 1:
            raise TidalError("comm_eff must be in (0, 1], hbm_bw > 0 and pulls_per_step >= 1")

    @property
    def sync(self) -> SyncPricing:
        """The pull/push pricing of this configuration (costmodel.sync), which the planner charges too."""
        return SyncPricing(self.comm_eff, self.param_bytes, self.grad_bytes, self.pulls_per_step, self.overlap_sync,
                           self.fwd_share)


@dataclass(frozen=True)
class PipelineTrace:
    """Executed operations of one pipeline: arrays over operations, in start order."""

    stage: np.ndarray  # int
    micro_batch: np.ndarray  # int
    kind: np.ndarray  # 0 forward, 1 backward
    start: np.ndarray  # s from step start
    end: np.ndarray
    pull_ready: np.ndarray  # per stage: earliest forward start allowed by the parameter pull
    sync_end: np.ndarray  # per stage: gradient push finished

    @property
    def finish(self) -> float:
        """Last backward of the pipeline (its latency, before the gradient push)."""
        return float(self.end.max()) if self.end.size else 0.0


@dataclass(frozen=True)
class StepResult:
    step_time: float  # s: sync + compute + optimizer (+ switch time charged to this step)
    compute_time: float  # s: last backward end over all pipelines
    switch_time: float  # s
    optimizer_time: float  # s
    pipelines: tuple[PipelinePlan, ...]
    traces: tuple[PipelineTrace, ...]
    busy: np.ndarray = field(repr=False)  # float64 [N]: compute seconds per device

    def pipeline_latencies(self) -> np.ndarray:
        """Per pipeline that ran: last backward end (Hydraulis Fig. 15b's rank latency)."""
        return np.array([t.finish for t, p in zip(self.traces, self.pipelines) if p.micro_batches])

    def device_intervals(self, device: int) -> list[tuple[float, float, int]]:
        """(start, end, kind) of every compute interval of `device` (several pipelines when a step switches)."""
        out: list[tuple[float, float, int]] = []
        for p, t in zip(self.pipelines, self.traces):
            if device in p.devices:
                s = p.devices.index(device) // (p.tp * p.cp)
                m = t.stage == s
                out += list(zip(t.start[m].tolist(), t.end[m].tolist(), t.kind[m].tolist()))
        return sorted(out)

    def idle_intervals(self, device: int) -> list[tuple[float, float]]:
        """(start, end) of every gap of `device` between 0 and the step end (waiting on bubbles, sync, other
        pipelines); with device_intervals it covers the step exactly."""
        out, t = [], 0.0
        for a, b, _ in self.device_intervals(device):
            if a > t:
                out.append((t, a))
            t = max(t, b)
        if self.step_time > t:
            out.append((t, self.step_time))
        return out

    def shifted(self, dt: float) -> StepResult:
        """The same step with every interval moved by dt seconds."""
        tr = tuple(replace(t, start=t.start + dt, end=t.end + dt, pull_ready=t.pull_ready + dt,
                           sync_end=t.sync_end + dt) for t in self.traces)
        return replace(self, traces=tr)


def stage_order(pp: int, v: int, stage: int, schedule: str) -> list[tuple[int, int]]:
    """(kind, micro-batch) in execution order on `stage` of a `pp`-stage pipeline with `v` micro-batches."""
    if schedule == "gpipe":
        return [(FWD, m) for m in range(v)] + [(BWD, m) for m in range(v)]
    warm = min(pp - stage - 1, v)
    out = [(FWD, m) for m in range(warm)]
    for i in range(v - warm):
        out += [(FWD, warm + i), (BWD, i)]
    return out + [(BWD, m) for m in range(v - warm, v)]


def run_pipeline(fwd: np.ndarray, bwd: np.ndarray, p2p: np.ndarray, release: np.ndarray,
                 schedule: str = "1f1b") -> tuple[np.ndarray, ...]:
    """Discrete-event run of one pipeline. fwd, bwd: [pp, v] seconds; p2p: [pp - 1, v] seconds from stage s to s + 1
    (the same back); release: [pp] earliest start of each stage's first operation. Returns (stage, micro-batch,
    kind, start, end) arrays in start order."""
    pp, v = fwd.shape
    orders = [stage_order(pp, v, s, schedule) for s in range(pp)]
    end = np.full((2, pp, v), np.nan)
    head = [0] * pp
    free = release.astype(np.float64).copy()
    out: list[tuple[int, int, int, float, float]] = []

    def ready(s: int) -> float | None:
        kind, m = orders[s][head[s]]
        if kind == FWD:
            dep = 0.0 if s == 0 else end[FWD, s - 1, m] + p2p[s - 1, m]
        else:
            dep = end[FWD, s, m] if s == pp - 1 else end[BWD, s + 1, m] + p2p[s, m]
        return None if np.isnan(dep) else max(float(dep), float(free[s]))

    heap: list[tuple[float, int]] = []
    for s in range(pp):
        if orders[s] and (t := ready(s)) is not None:
            heapq.heappush(heap, (t, s))
    while heap:
        t, s = heapq.heappop(heap)
        kind, m = orders[s][head[s]]
        e = t + (fwd[s, m] if kind == FWD else bwd[s, m])
        end[kind, s, m] = e
        free[s] = e
        out.append((s, m, kind, t, e))
        head[s] += 1
        # the stage itself and the neighbour that may wait on this operation
        for s2 in {s, s + 1 if kind == FWD else s - 1}:
            if (0 <= s2 < pp and head[s2] < len(orders[s2]) and (t2 := ready(s2)) is not None
                    and (t2, s2) not in heap):
                heapq.heappush(heap, (t2, s2))
    if len(out) != 2 * pp * v:
        raise TidalError("pipeline schedule deadlocked")  # cannot happen for 1F1B / GPipe orders
    arr = np.array(out, dtype=np.float64).reshape(-1, 5)
    return (arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64), arr[:, 3],
            arr[:, 4])


class Simulator:
    """Simulates steps of plans under one cost model and configuration. Caches per-stage coefficients."""

    def __init__(self, cost_model: CostModel, config: SimConfig | None = None) -> None:
        self.cm = cost_model
        self.cfg = config or SimConfig()
        self.model, self.cluster = cost_model.model, cost_model.cluster
        self.n = self.cluster.num_devices
        self._coeffs: dict[tuple, LatencyCoeffs] = {}
        self._kernels: dict[tuple, object] = {}
        self._scales: dict[tuple, tuple[float, float, float] | None] = {}
        self._types = [self.cluster.device_type(d) for d in range(self.n)]
        self._nodes = [self.cluster.node_of(d) for d in range(self.n)]
        self.hbm_bw = self.cfg.hbm_bw or min(t.hbm_bw for t in self._types)

    # -- per-stage costs -----------------------------------------------------------------------------------------

    def stage_coeffs(self, tp: int, cp: int, layers: int, last: bool, dev: DeviceType) -> LatencyCoeffs:
        """Coefficients of one stage of `layers` layers: per-layer slope of the cost model (no PP transfer, which the
        simulator charges explicitly) times `layers`, plus the LM head on the last stage."""
        key = (tp, cp, layers, last, dev.name)
        if key not in self._coeffs:
            k1 = self.cm.coeffs(ParallelScheme(tp, 1, cp, (layers,)), dev)
            k2 = self.cm.coeffs(ParallelScheme(tp, 1, cp, (layers + 1,)), dev)
            per = [max(0.0, y - x) for x, y in zip((k1.a, k1.b, k1.c, k1.d), (k2.a, k2.b, k2.c, k2.d))]
            head = [max(0.0, x - layers * p) for x, p in zip((k1.a, k1.b, k1.c, k1.d), per)]
            self._coeffs[key] = LatencyCoeffs(*(layers * p + (h if last else 0.0) for p, h in zip(per, head)))
        return self._coeffs[key]

    def fit_scale(self, p: PipelinePlan) -> tuple[float, float, float] | None:
        """Per-term factors (a, b, c) that make the slowest stage's coefficients equal to a fitted model's measured
        fit of the pipeline's scheme; None when the cost model has no fit for it. A fit is one number per scheme (the
        slowest stage's forward + backward, `tidal profile`), not a per-layer slope, so `stage_coeffs` (which asks
        the model for one-stage schemes of L and L + 1 layers, never profiled) would otherwise see only the fitted
        model's analytic fallback. The stages keep the analytic split between them; the envelope (element-wise max
        over stages, as the analytic model combines stages) is scaled onto the fit. The per-document term d (which
        the analytic model does not have) is the fit's d on the stage with the most layers, in proportion to the
        layers on the others (`fit_d`)."""
        if not isinstance(self.cm, FittedCostModel):
            return None
        even = ParallelScheme(p.tp, p.pp, p.cp).stage_layers(self.model.layers)
        split = p.layer_split or even
        key = (p.tp, p.pp, p.cp, tuple(split), tuple(t.name for t in self.stage_types(p)))
        if key not in self._scales:
            fit = self.cm.fit_for(str(ParallelScheme(p.tp, p.pp, p.cp, None if tuple(split) == even else split)),
                                  self.stage_types(p))
            if fit is None:
                self._scales[key] = None
            else:
                types = self.stage_types(p)
                ks = [self.stage_coeffs(p.tp, p.cp, split[s], s == p.pp - 1, types[s]) for s in range(p.pp)]
                env = (max(k.a for k in ks), max(k.b for k in ks), max(k.c for k in ks))
                self._scales[key] = tuple(f / e if e > 0 else 1.0
                                          for f, e in zip((fit.coeffs.a, fit.coeffs.b, fit.coeffs.c), env))
        return self._scales[key]

    def fit_d(self, p: PipelinePlan) -> float:
        """The fitted per-document seconds of the pipeline's scheme (only called when `fit_scale` found a fit)."""
        split = p.layer_split or ParallelScheme(p.tp, p.pp, p.cp).stage_layers(self.model.layers)
        even = ParallelScheme(p.tp, p.pp, p.cp).stage_layers(self.model.layers)
        fit = self.cm.fits[str(ParallelScheme(p.tp, p.pp, p.cp, None if tuple(split) == even else split))]
        return float(fit.coeffs.d)

    def _cp_factor(self, lengths: np.ndarray, cp: int, tp: int, mode: str, dev: DeviceType) -> float:
        """Slowest CP rank's attention time over a perfect 1/CP share (`cp_adaptive.cp_imbalance`, the charge the
        planner's estimates use too)."""
        if cp == 1 or mode == "heads" or not self.cfg.cp_imbalance:
            return 1.0
        key = (tp, dev.name)
        if key not in self._kernels:
            self._kernels[key] = cp_kernel(self.model, tp, dev)
        return cp_imbalance(lengths, cp, self._kernels[key], mode)

    def stage_types(self, p: PipelinePlan) -> list[DeviceType]:
        n = p.tp * p.cp
        out = []
        for s in range(p.pp):
            types = {self._types[d] for d in p.devices[s * n:(s + 1) * n]}
            out.append(min(types, key=lambda t: (t.peak_flops, t.memory_bytes, t.name)))
        return out

    def stage_params(self, p: PipelinePlan) -> np.ndarray:
        """Parameters held per device of every stage (its TP shard; costmodel.sync.stage_params)."""
        return stage_params(self.model, p.tp, p.layer_split or ParallelScheme(p.tp, p.pp, p.cp).stage_layers(
            self.model.layers))

    def _bw(self, a: int, b: int) -> float:
        ta, tb = self._types[a], self._types[b]
        bw = min(ta.intra_bw, tb.intra_bw) if self._nodes[a] == self._nodes[b] else min(ta.inter_bw, tb.inter_bw)
        return bw * self.cfg.comm_eff

    def sync_bw(self, device: int) -> float:
        """Bandwidth of a device's pull/push to the owners (costmodel.sync.sync_bandwidth)."""
        return sync_bandwidth(self.cluster, device, self.cfg.comm_eff)

    # -- one pipeline, one step ----------------------------------------------------------------------------------

    def pipeline_times(self, p: PipelinePlan, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """fwd, bwd [pp, v] and p2p [pp - 1, v] seconds of a pipeline's micro-batches."""
        v = len(p.micro_batches)
        split = p.layer_split or ParallelScheme(p.tp, p.pp, p.cp).stage_layers(self.model.layers)
        types = self.stage_types(p)
        scale = self.fit_scale(p)
        d_top = self.fit_d(p) / max(split) if scale is not None else 0.0  # fitted d per layer of the longest stage
        ks = []
        for s in range(p.pp):
            k = self.stage_coeffs(p.tp, p.cp, split[s], s == p.pp - 1, types[s])
            if scale is not None:
                k = LatencyCoeffs(k.a * scale[0], k.b * scale[1], k.c * scale[2], d_top * split[s])
            ks.append(k)
        fb = np.zeros((p.pp, v))
        toks = np.zeros(v)
        for m, mb in enumerate(p.micro_batches):
            ls = lengths[list(mb)].astype(np.float64)
            toks[m] = ls.sum()
            mode = p.cp_sharding[m] if m < len(p.cp_sharding) else "per-seq"
            sq = float(np.sum(ls * ls))
            for s in range(p.pp):
                k = ks[s]
                f = self._cp_factor(lengths[list(mb)], p.cp, p.tp, mode, types[s]) if p.cp > 1 and k.a > 0 else 1.0
                fb[s, m] = k.c + k.a * sq * f + k.b * toks[m] + k.d * len(mb)
        fs = self.cfg.fwd_share
        n = p.tp * p.cp
        p2p = np.zeros((max(p.pp - 1, 0), v))
        for s in range(p.pp - 1):
            bw = self._bw(p.devices[s * n], p.devices[(s + 1) * n])
            p2p[s] = toks * 2.0 * self.model.hidden / n / bw
        return fb * fs, fb * (1 - fs), p2p

    def simulate(self, step: StepPlan, *, pull: bool = True, push: bool = True, optimizer: bool = True,
                 switch_time: float = 0.0, sync_group: int | None = None) -> StepResult:
        """Run one step. `sync_group`: devices over which parameters/gradients are sharded (default: all N)."""
        lengths = np.asarray(step.seq_lengths, dtype=np.int64)
        cfg = self.cfg
        g = sync_group or self.n
        sync = cfg.sync
        busy = np.zeros(self.n)
        traces = []
        last_end = 0.0
        sync_done = 0.0
        for p in step.pipelines:
            if not p.micro_batches:
                traces.append(PipelineTrace(*(np.zeros(0, dtype=np.int64),) * 3, np.zeros(0), np.zeros(0),
                                            np.zeros(p.pp), np.zeros(p.pp)))
                continue
            fwd, bwd, p2p = self.pipeline_times(p, lengths)
            split = p.layer_split or ParallelScheme(p.tp, p.pp, p.cp).stage_layers(self.model.layers)
            params = self.stage_params(p)
            n = p.tp * p.cp
            bws = np.array([self.sync_bw(p.devices[s * n]) for s in range(p.pp)])
            pull_t, push_t = sync_seconds(params, bws, g, sync)
            pull_t, push_t = (pull_t if pull else np.zeros(p.pp)), (push_t if push else np.zeros(p.pp))
            L = np.asarray(split, dtype=np.float64)
            # first forward of stage s starts once layer j's pull is in before the forward reaches layer j
            release = exposed(pull_t, L, fwd[:, 0], cfg.overlap_sync)
            st, mb, kind, start, end = run_pipeline(fwd, bwd, p2p, release, cfg.schedule)
            sync_end = np.zeros(p.pp)
            for s in range(p.pp):
                sel = (st == s) & (kind == BWD)
                i = int(np.flatnonzero(sel)[-1])
                t0, t1 = start[i], end[i]
                d = t1 - t0
                sync_end[s] = t1 + float(exposed(push_t[s], L[s], d, cfg.overlap_sync))
                dur = float(np.sum(end[st == s] - start[st == s]))
                busy[list(p.devices[s * n:(s + 1) * n])] += dur
            tr = PipelineTrace(st, mb, kind, start, end, release, sync_end)
            traces.append(tr)
            last_end = max(last_end, tr.finish)
            sync_done = max(sync_done, float(sync_end.max()))
        opt = (self.model.num_params() / self.n * cfg.optimizer_bytes_per_param / self.hbm_bw) if optimizer else 0.0
        total = switch_time + max(sync_done, last_end) + opt
        return StepResult(total, last_end, switch_time, opt, step.pipelines, tuple(traces), busy)
