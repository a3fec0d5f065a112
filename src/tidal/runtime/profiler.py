"""`tidal profile`: the real runtime's forward + backward per scheme, and the fitted latency and MaxLen.

For each scheme P = <TP, PP, CP> with k = TP * PP * CP ranks, N // k replicas of one pipeline run side by side on the
N ranks of the cluster (so the machine is as loaded as in training, where every rank works), each on the same
micro-batch, one micro-batch per `run_pipeline` call (reduce_replicas=False, as the executor calls it; CP sharding
per micro-batch as the planner's adaptive policy picks it). Per micro-batch:

* seconds: per replica, the slowest rank's forward + backward time (CPU: `time.thread_time` of the rank's training
  thread, which excludes waiting on receives and gloo's own threads; CUDA: wall time to a device synchronise); the
  median over replicas and repeats. This is the profile format's "slowest stage" time;
* activation bytes: the largest over ranks of the autograd-saved bytes (CPU: `saved_tensors_hooks`, parameters
  excluded) or of `torch.cuda.max_memory_allocated` above the allocation before the call (CUDA).

`profile_model` fits a, b, c per scheme (`costmodel.fitted.fit_rows`) and MaxLen from the activation bytes
(`costmodel.memory.measured_max_len`: a one-document micro-batch, PP in flight under 1F1B, the analytic states,
against the device's memory: CUDA's total memory, else the configured per-device budget).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from tidal.core.cluster import ClusterSpec, GiB
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Pipeline
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.fitted import FittedCostModel, ProfileRow, fit_rows
from tidal.costmodel.memory import MemoryConfig, fit_activation_bytes, measured_max_len
from tidal.models.dense import choose_compile
from tidal.planner.stepper import with_cp_sharding
from tidal.runtime.config import COMPUTE_DTYPES, compute_dtype_for
from tidal.runtime.gcsync import StepGC
from tidal.runtime.groups import GroupCache
from tidal.runtime.launch import run_distributed
from tidal.runtime.pipeline import RankGrid, build_stage_model, run_pipeline


@dataclass(frozen=True)
class ProfilePoint:
    lengths: tuple[int, ...]
    seconds: float  # median over replicas and repeats of the slowest rank's forward + backward
    act_bytes: float  # largest activation bytes over ranks


@dataclass(frozen=True)
class SchemeProfile:
    scheme: ParallelScheme
    points: tuple[ProfilePoint, ...]
    replicas: int
    wall_s: float


@dataclass(frozen=True)
class ProfileResult:
    model: FittedCostModel
    schemes: tuple[SchemeProfile, ...]
    activations: MappingProxyType  # str(scheme) -> ActivationFit
    memory_bytes: float
    time_source: str  # "thread-cpu" or "cuda-wall"
    dtype: str = "float32"  # the compute dtype profiled (what training computes in)

    def rows(self) -> list[ProfileRow]:
        return [ProfileRow(s.scheme, p.lengths, p.seconds) for s in self.schemes for p in s.points]


def auto_schemes(spec: ModelSpec, n_devices: int) -> tuple[ParallelScheme, ...]:
    """`--schemes auto`: every <TP, PP, CP> of powers of two with TP * PP * CP <= N, at most two degrees above 1,
    valid for the model (TP divides the heads, PP <= layers). For N = 4 and `tiny`: tp1, tp2, tp4, pp2, pp4, cp2,
    cp4, tp2pp2, tp2cp2, pp2cp2."""
    out = []
    degrees = [d for d in (1, 2, 4, 8, 16) if d <= n_devices]
    for tp in degrees:
        for pp in degrees:
            for cp in degrees:
                s = ParallelScheme(tp, pp, cp)
                if s.num_devices > n_devices or sum(d > 1 for d in (tp, pp, cp)) > 2:
                    continue
                try:
                    s.validate(spec)
                except TidalError:
                    continue
                out.append(s)
    return tuple(sorted(out, key=lambda s: (s.num_devices, s.pp, s.cp, s.tp)))


def _cp_modes(spec: ModelSpec, cluster: ClusterSpec, scheme: ParallelScheme, devices: tuple[int, ...],
              mbs: Sequence[Sequence[int]]) -> list[tuple[str, ...]]:
    """The CP sharding the planner's adaptive policy picks for each micro-batch (empty for CP = 1)."""
    if scheme.cp == 1:
        return [() for _ in mbs]
    cm = AnalyticCostModel(spec, cluster)
    out = []
    for lens in mbs:
        pp = PipelinePlan(scheme.tp, scheme.pp, scheme.cp, devices, max(lens), (tuple(range(len(lens))),), 0.0)
        step = with_cp_sharding(StepPlan(tuple(range(len(lens))), tuple(lens), 0, (pp,), (), 0.0, 0.0), cm,
                                "adaptive")
        out.append(step.pipelines[0].cp_sharding)
    return out


def _worker(rank: int, world: int, spec: ModelSpec, scheme: ParallelScheme, mbs: list[list[int]],
            modes: list[tuple[str, ...]], repeats: int, backend: str, seed: int,
            dtype: str = "float32", compile: str = "off") -> list[tuple[float, float]]:
    torch.set_num_threads(1)  # ranks share the machine's cores
    k = scheme.num_devices
    pipes = [Pipeline(scheme, tuple(range(r * k, (r + 1) * k))) for r in range(world // k)]
    groups = GroupCache().create_all(pipes)
    if rank >= len(pipes) * k:  # a rank left over when k does not divide N: idle
        return []
    pipe = pipes[rank // k]
    grid = RankGrid.build(pipe, rank, groups)
    cuda = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    # the dense parts as training runs them (`[model] compile`, decision 140: auto compiles them on CUDA)
    run_compile = choose_compile(compile, device, DTYPES[dtype], spec.hidden)[0]
    model = build_stage_model(spec, grid, seed=seed, attn_backend=backend, device=device, dtype=DTYPES[dtype],
                              compile=run_compile)
    g = torch.Generator().manual_seed(seed)
    out = []
    with StepGC(1) as sgc:  # as training runs it (decision 66): no collection inside a timed call
        for i, lens in enumerate([[min(64, min(len(m) for m in mbs) * 16)]] + list(mbs)):  # the first is a warm-up
            docs = [torch.randint(0, spec.vocab, (n + 1,), generator=g) for n in lens]
            plan = PipelinePlan(scheme.tp, scheme.pp, scheme.cp, pipe.devices, max(lens), (tuple(range(len(lens))),),
                                0.0, (modes[i - 1] if i else ("per-seq",)) if scheme.cp > 1 else (), scheme.layer_split)
            times, peak = [], 0.0
            for _ in range(repeats if i else 1):
                model.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    t0 = time.perf_counter()
                else:
                    t0 = time.thread_time()
                res = run_pipeline(model, grid, plan, lens, docs, reduce_replicas=False)
                if cuda:
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                    peak = max(peak, float(torch.cuda.max_memory_allocated() - base))
                else:
                    times.append(time.thread_time() - t0)
                    peak = max(peak, float(res.peak_saved_bytes))
                sgc.after_step(1)  # cyclic garbage collected between micro-batches, outside the timing
            if i:
                out.append((statistics.median(times), peak))
    return out


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def profile_dtype(dtype: str, dist_backend: str) -> str:
    """The concrete compute dtype a profile runs in: `dtype`, with auto resolved for the backend's device as
    training resolves it (bfloat16 on CUDA under NCCL, float32 on CPU)."""
    if dtype not in COMPUTE_DTYPES:
        raise TidalError(f"profile dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {dtype!r}")
    return compute_dtype_for(dtype, "float32", "cuda" if dist_backend == "nccl" else "cpu")


def profile_scheme(spec: ModelSpec, cluster: ClusterSpec, scheme: ParallelScheme, mbs: Sequence[Sequence[int]], *,
                   repeats: int = 1, attn_backend: str = "auto", seed: int = 0, dist_backend: str = "gloo",
                   timeout_s: float = 600.0, dtype: str = "auto", compile: str = "auto") -> SchemeProfile:
    """Run `scheme` on the cluster's N ranks (N // k replicas side by side) over micro-batches `mbs`, in the compute
    dtype `dtype` (auto: training's default on the backend's device, config.compute_dtype_for)."""
    dtype = profile_dtype(dtype, dist_backend)
    scheme.validate(spec)
    n, k = cluster.num_devices, scheme.num_devices
    if k > n:
        raise TidalError(f"scheme {scheme.short()} needs {k} devices; cluster {cluster.name} has {n}")
    if repeats < 1 or not mbs or any(not m or min(m) < 1 for m in mbs):
        raise TidalError("profile needs repeats >= 1 and non-empty micro-batches of positive lengths")
    modes = _cp_modes(spec, cluster, scheme, tuple(range(k)), mbs)
    t0 = time.perf_counter()
    per_rank = run_distributed(_worker, n, spec, scheme, [list(m) for m in mbs], modes, repeats, attn_backend, seed,
                               dtype, compile, backend=dist_backend, timeout_s=timeout_s)
    replicas = n // k
    points = []
    for i, lens in enumerate(mbs):
        slowest = [max(per_rank[r * k + j][i][0] for j in range(k)) for r in range(replicas)]
        act = max(per_rank[r][i][1] for r in range(replicas * k))
        points.append(ProfilePoint(tuple(int(x) for x in lens), float(statistics.median(slowest)), act))
    return SchemeProfile(scheme, tuple(points), replicas, time.perf_counter() - t0)


def profile_model(spec: ModelSpec, cluster: ClusterSpec, schemes: Sequence[ParallelScheme],
                  mbs: Sequence[Sequence[int]], *, memory_gib: float | None = None, repeats: int = 1,
                  attn_backend: str = "auto", seed: int = 0, dist_backend: str = "gloo", timeout_s: float = 600.0,
                  on_scheme: Callable[[SchemeProfile], None] | None = None, dtype: str = "auto",
                  compile: str = "auto") -> ProfileResult:
    """Profile every scheme in the compute dtype `dtype` (auto: bfloat16 under NCCL, else float32) with the dense
    parts compiled as `compile` says (`[model] compile`; auto: as training on the device), fit latency (a, b, c) and
    MaxLen; returns the fitted model and the measurements."""
    dtype = profile_dtype(dtype, dist_backend)
    if not schemes:
        raise TidalError("no scheme to profile")
    for s in schemes:  # every refusal before any rank starts
        s.validate(spec)
        if s.num_devices > cluster.num_devices:
            raise TidalError(f"scheme {s.short()} needs {s.num_devices} devices; cluster {cluster.name} has "
                             f"{cluster.num_devices}")
    cuda = dist_backend == "nccl"
    if memory_gib is not None:
        if not memory_gib > 0:
            raise TidalError(f"--memory-gib must be positive, got {memory_gib}")
        mem = memory_gib * GiB
    elif cuda:
        mem = float(torch.cuda.get_device_properties(0).total_memory)
    else:
        mem = cluster.device_type(0).memory_bytes
    device = dataclasses.replace(cluster.device_type(0), memory_bytes=mem)
    profiles = []
    for s in schemes:
        prof = profile_scheme(spec, cluster, s, mbs, repeats=repeats, attn_backend=attn_backend, seed=seed,
                              dist_backend=dist_backend, timeout_s=timeout_s, dtype=dtype, compile=compile)
        profiles.append(prof)
        if on_scheme is not None:
            on_scheme(prof)
    rows = [ProfileRow(p.scheme, pt.lengths, pt.seconds) for p in profiles for pt in p.points]
    fits = fit_rows(rows)
    acts, out = {}, {}
    for p in profiles:
        key = str(p.scheme)
        act = fit_activation_bytes([(pt.lengths, pt.act_bytes) for pt in p.points],
                                   "cuda-peak" if cuda else "saved-tensors")
        acts[key] = act
        ml = measured_max_len(spec, p.scheme, device, cluster.num_devices, act, MemoryConfig())
        out[key] = dataclasses.replace(fits[key], max_len=ml)
    model = FittedCostModel(spec, cluster, MappingProxyType(out), AnalyticCostModel(spec, cluster))
    return ProfileResult(model, tuple(profiles), MappingProxyType(acts), mem, "cuda-wall" if cuda else "thread-cpu",
                         dtype)


def result_extra(res: ProfileResult, mbs_totals: Sequence[int]) -> dict:
    """Informational keys of the fitted model file written by `tidal profile` (ignored by the loader)."""
    return {
        "profile": {"time": res.time_source, "dtype": res.dtype, "totals": list(mbs_totals),
                    "replicas": {str(p.scheme): p.replicas for p in res.schemes}},
        "memory": {"device_bytes": res.memory_bytes,
                   "activations": {k: {"m0": a.m0, "m1": a.m1, "m2": a.m2, "source": a.source}
                                   for k, a in res.activations.items()}},
    }


__all__ = ["ProfilePoint", "ProfileResult", "SchemeProfile", "auto_schemes", "profile_dtype", "profile_model",
           "profile_scheme", "result_extra"]
