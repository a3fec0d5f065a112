"""The executor: heterogeneous strategies in one world, optimization-propagation disaggregation, per-step switching.

One world of N ranks. At start-up every pipeline of every candidate strategy is placed, its process groups created
(one :class:`GroupCache`), its stage model built, and this rank's part of the pull / push plans of every candidate
derived from the closed form of the shard ranges (`runtime.reshard.local`: no rank plans the world's messages).
Each step (Hydraulis §5.1-5.2):

1. **pull**: every rank receives its stage's TP shard of every parameter it holds, from the fully-sharded master
   copy, in the compute dtype (`runtime.reshard` pull plan of the step's strategy);
2. **propagate**: each rank runs its pipeline's micro-batches (`run_pipeline(reduce_replicas=False)`); a pipeline
   with no sequence skips compute and contributes zero gradients;
3. **push**: gradients, partial over CP ranks, tied-embedding stages and pipelines, are summed and scattered to their
   owner shards in the master dtype (push plan);
4. **optimize**: AdamW on the owned shards, clipped by the global norm (:mod:`tidal.runtime.optim`).

The loss is the token-weighted mean over the whole step, so the gradient equals single-process training on the same
documents. Which strategy and which sequences a step uses comes from a :class:`tidal.core.StepPlan` that every rank
receives (the caller decides who plans; `tidal train` plans on rank 0 and broadcasts, docs/decisions.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from tidal.core.attnrule import H200_RULE, AttnBackendRule
from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.recompute import parse_recompute, stage_recompute
from tidal.core.strategy import Strategy
from tidal.models.attention import describe_backend
from tidal.models.dense import choose_compile
from tidal.models.init import derive_seed, init_slice
from tidal.runtime.config import compute_dtype_for
from tidal.runtime.exec_state import ExecutorState
from tidal.runtime.exec_util import _bytes, _has_submodule, _param_groups, fetch_from, step_tokens
from tidal.runtime.flat import FlatStage
from tidal.runtime.groups import GroupCache
from tidal.runtime.optim import OptimConfig, ShardedAdamW, shard_range
from tidal.runtime.pipeline import RankGrid, build_stage_model, held_params, run_pipeline
from tidal.runtime.reconfig import ReconfigStats, reconfig_stats
from tidal.runtime.reshard.execute import execute, start
from tidal.runtime.reshard.local import Links, LocalPlanner
from tidal.runtime.streams import PullStream, PushStream, check_layout
from tidal.runtime.tp import sequence_parallel_partials

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ExecConfig:
    seed: int = 0  # model initialisation
    master_dtype: str = "float32"  # fp32 master weights and Adam moments (float64 for verification)
    compute_dtype: str = "auto"  # parameters pulled in this dtype; auto: config.compute_dtype_for (bf16 on CUDA)
    schedule: str = "1f1b"
    attn_backend: str = "auto"
    compile: str = "auto"  # "dense": each stage's RMSNorm and SwiGLU gate compiled; auto: dense on CUDA (decision 140)
    attn_rule: AttnBackendRule = H200_RULE  # "mixed" (auto on CUDA, decision 140): sdpa or flex per micro-batch
    overlap_pull: bool = True  # pull layer by layer in the background; each module waits for its own parameters
    pull_window: int = 2  # parameter groups this rank receives into, in flight at once (decision 75)
    push_window: int = 2  # parameter groups' pushes in flight at once, posted from the backward (decision 75)
    overlap_push: bool = True  # post each group's push from the backward once its gradients are final; False: after
    device: str = "auto"  # auto: the current CUDA device under NCCL, else CPU; or "cpu" / "cuda"
    sequence_parallel: bool = False  # Megatron-style SP in every TP group (runtime/tp.py)
    # activation recomputation per stage (decision 90): one mode, or one per stage ("full,none": stage s runs entry
    # s, deeper stages the last); a property of the stage model build_stage_model builds
    recompute: tuple[str, ...] | str = ("none",)
    # per scheme (str(ParallelScheme) -> per-stage modes), overriding `recompute`: `[train] recompute = "auto"`
    recompute_schemes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    offload: bool = False  # every layer's saved activations to (pinned) host memory between forward and backward

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", parse_recompute(self.recompute))
        if self.master_dtype not in DTYPES:
            raise TidalError(f"master_dtype must be one of {', '.join(DTYPES)}, got {self.master_dtype!r}")
        if self.compute_dtype not in ("auto", *DTYPES):
            raise TidalError(f"compute_dtype must be one of auto, {', '.join(DTYPES)}, got {self.compute_dtype!r}")
        if self.master_dtype == "bfloat16":
            raise TidalError("master_dtype must be float32 or float64 (bf16 master weights lose updates)")
        if self.pull_window < 1 or self.push_window < 1:
            raise TidalError(f"pull_window and push_window must be at least 1, got {self.pull_window}, "
                             f"{self.push_window}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise TidalError(f"device must be auto, cpu or cuda, got {self.device!r}")

    def stage_recompute(self, scheme, stage: int) -> str:
        """The recomputation mode of `stage` of a pipeline of `scheme`."""
        modes = dict(self.recompute_schemes).get(str(scheme), self.recompute)
        return stage_recompute(modes, stage)

    def dtypes(self, device: torch.device | str) -> tuple[torch.dtype, torch.dtype]:
        """(master, compute) torch dtypes on `device`, with compute_dtype "auto" resolved (compute_dtype_for)."""
        compute = compute_dtype_for(self.compute_dtype, self.master_dtype, torch.device(device).type)
        return DTYPES[self.master_dtype], DTYPES[compute]


@dataclass(frozen=True)
class StepMetrics:
    loss: float  # token-weighted mean cross-entropy over the step (same on every rank)
    tokens: int
    sequences: int
    busy_s: float  # this rank's CPU time over the step (time.thread_time: the training thread)
    compute_busy_s: float  # ... in forward/backward only (on CUDA: their GPU time, from CUDA events)
    process_busy_s: float  # CPU time of the whole rank process, incl. the communication backend's threads
    wall_s: float
    pull_s: float  # wall time of the pull (includes waiting for the ranks it talks to)
    push_s: float  # wall time of the push (includes waiting for the slowest pipeline to finish its backward)
    pull_cpu_s: float  # this rank's CPU time in the pull
    push_cpu_s: float
    pull_bytes: int  # sent + received by this rank
    push_bytes: int
    optim: dict
    push_overlapped: int = 0  # parameter groups whose push was posted before the backward ended (overlap_push)
    reconfig: ReconfigStats = ReconfigStats()  # this rank's reconfiguration figures (runtime/reconfig.py)


class Executor(ExecutorState):
    """Trains on `world` ranks with any of `candidates` per step. Construct on every rank, in the same order."""

    def __init__(self, spec: ModelSpec, cluster: ClusterSpec, candidates: Sequence[Strategy], cfg: ExecConfig,
                 optim: OptimConfig, groups: GroupCache | None = None) -> None:
        if not dist.is_initialized():
            raise TidalError("the executor needs an initialised torch.distributed process group")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if cluster.num_devices != self.world:
            raise TidalError(f"cluster {cluster.name} has {cluster.num_devices} devices but the world has "
                             f"{self.world} ranks")
        self.spec, self.cfg, self.optim_cfg, self.candidates = spec, cfg, optim, tuple(candidates)
        self.device = resolve_device(cfg.device)
        self.master_dtype, self.compute_dtype = cfg.dtypes(self.device)  # compute_dtype auto resolved here
        self.table = param_table(spec)
        for info in self.table:
            if info.shape[0] < self.world:
                raise TidalError(f"{info.name} has {info.shape[0]} rows < {self.world} ranks: cannot shard it")
        self.groups = groups if groups is not None else GroupCache()
        self.groups.create_all([p for s in self.candidates for p in s.pipelines])
        self.groups.p2p_group()  # the resharding engine's p2p group, created and initialised at a fixed point
        # each rank plans only its own part of every pull and push (decision 74)
        self._links = Links.from_cluster(cluster, self.world)
        # gradients accumulate in at least fp32 across micro-batches (a 16-bit compute dtype would lose them)
        self.grad_dtype = self.compute_dtype if torch.finfo(self.compute_dtype).bits >= 32 else torch.float32
        self.group_index, self.module_group = _param_groups(self.table)
        self.grids, self.models = [], []
        self.pull_groups: list[list[tuple[list[int], object]]] = []  # per candidate: (table indices, plan) per group
        self.push_groups: list[list[tuple[list[int], object]]] = []  # ... in push order (the pull's, reversed)
        self.pull_receives: list[list[bool]] = []  # per candidate and pull group: whether this rank receives into it
        self._flat: list[FlatStage | None] = []  # per candidate: this rank's stage parameters and gradients
        self._pulling: PullStream | None = None
        self._pushing: PushStream | None = None
        self._hooks_left: list[int] = []  # per group: gradient hooks still to come before its gradients are final
        self._late: set[int] = set()  # groups whose gradients change after the backward (sequence parallelism)
        self._push_grads: list = []
        self.probe: Callable[[str], None] | None = None  # memory accounting: called at the pull's and push's peaks
        # RMSNorm and SwiGLU's gate: eager or compiled (decision 140); auto falls back to eager where compiling fails
        compile_mode, compile_why = choose_compile(cfg.compile, self.device, self.compute_dtype, spec.hidden)
        self.compile_mode = f"{compile_mode} ({compile_why})" if compile_why else compile_mode  # in the step rows
        for k, strategy in enumerate(self.candidates):
            if any(d >= self.world for p in strategy.pipelines for d in p.devices):
                raise TidalError(f"candidate {k} ({strategy}) uses devices beyond the world of {self.world}")
            pull_groups, push_groups = self._plan_candidate(k)
            self.pull_groups.append(pull_groups)
            self.push_groups.append(push_groups)
            self.pull_receives.append([bool(plan.rank_view(self.rank).dst_box) for _, plan in pull_groups])
            mine = [j for j, p in enumerate(strategy.pipelines) if self.rank in p.devices]
            if not mine:
                self._check_layout(None, pull_groups, push_groups, k)
                self.grids.append(None)
                self.models.append(None)
                self._flat.append(None)
                continue
            grid = RankGrid.build(strategy.pipelines[mine[0]], self.rank, self.groups)
            model = build_stage_model(spec, grid, seed=cfg.seed, attn_backend=cfg.attn_backend, attn_rule=cfg.attn_rule,
                                      dtype=self.compute_dtype, device=self.device, init=False,  # pulled each step
                                      sequence_parallel=cfg.sequence_parallel,
                                      recompute=cfg.stage_recompute(grid.scheme, grid.stage), offload=cfg.offload,
                                      compile=compile_mode)
            self._check_layout(model, pull_groups, push_groups, k)
            self.grids.append((mine[0], grid))
            self.models.append(model)
            held = held_params(model, spec)
            group_of = {id(held[i]): g for g, idx in enumerate(self.group_index) for i in idx if held[i] is not None}
            if set(group_of) != {id(p) for p in model.parameters()}:  # each hook must count toward its own group
                raise TidalError(f"candidate {k}: the stage's parameters and the parameter table's groups disagree")
            self._flat.append(FlatStage(model, self.grad_dtype, group_of,  # idle until its step: no storage
                                    on_grad=lambda g, k=k: self._grad_hook(k, g)))
            if cfg.overlap_pull:
                self._install_hooks(model, k)
        # the attention kernel every stage runs, with why faster ones were passed over (reported in the step rows)
        self.attn_backend = describe_backend(cfg.attn_backend, self.device, self.compute_dtype,
                                             head_dim=spec.head_dim)
        self._active: int | None = None
        self._last: int | None = None  # candidate of the last step that updated (reconfiguration accounting)
        self._pull_wait_cpu = 0.0
        self._init_master()

    def attn_picks(self) -> dict[str, int]:
        """Under "mixed": backend -> micro-batches this rank's stages ran with it so far (every candidate's model)."""
        out: dict[str, int] = {}
        for model in self.models:
            for b, n in ({} if model is None else model.attn_picks).items():
                out[b] = out.get(b, 0) + n
        return out

    def _plan_candidate(self, k: int):
        """Candidate k's pull per parameter group (forward order) and its push per parameter group (backward order:
        the head first, the embedding last), the one order every rank posts them in. This rank's parts only (decision
        74): LNK pulls and pushes are point-to-point, so they need no process group beyond the p2p group."""
        planner = LocalPlanner(self.spec, self.candidates[k], self.world, self.rank, self._links, self.table)
        pull_size, push_size = torch.finfo(self.compute_dtype).bits // 8, torch.finfo(self.master_dtype).bits // 8
        pulls = [(idx, planner.pull(idx, itemsize=pull_size)) for idx in self.group_index]
        pushes = [(idx, planner.push(idx, itemsize=push_size)) for idx in reversed(self.group_index)]
        return pulls, pushes

    def _check_layout(self, model: torch.nn.Module | None, pulls, pushes, k: int) -> None:
        held = held_params(model, self.spec) if model is not None else [None] * len(self.table)
        check_layout(self.rank, self.world, self.table, held, pulls, pushes, k)

    def _init_master(self) -> None:
        """Master shards (rows shard_range of every parameter) initialised alone to their slice of the unsharded
        model's initialisation with the same seed (models/init.py): no rank materialises the whole model."""
        init_seed = derive_seed(self.cfg.seed)
        shards, decay = [], []
        for i, info in enumerate(self.table):
            rows = shard_range(info.shape[0], self.world, self.rank)
            shards.append(init_slice(info, i, init_seed, rows, dtype=self.master_dtype, device=self.device))
            decay.append(len(info.shape) > 1)
        self.optim = ShardedAdamW(shards, decay, self.optim_cfg, group=None)

    @property
    def master(self) -> list[torch.Tensor]:
        return self.optim.params

    def _pull(self, k: int) -> tuple[float, float, int]:
        """Synchronous pull (overlap_pull=False): one parameter group after the other, in the same order on every
        rank, each copied into the module parameters before the next group's buffers are made."""
        t0, c0 = time.perf_counter(), time.thread_time()
        if self._flat[k] is not None:
            self._flat[k].alloc_params()
        held = held_params(self.models[k], self.spec) if self.models[k] is not None else None
        nbytes = 0
        for idx, plan in self.pull_groups[k]:
            inputs = [self.master[i].to(self.compute_dtype) for i in idx]
            outs = execute(plan, inputs, self.groups, dtype=self.compute_dtype, device=self.device)
            if held is not None:
                with torch.no_grad():
                    for i, x in zip(idx, outs):
                        if held[i] is not None:
                            held[i].copy_(x)
            nbytes += _bytes(plan, self.rank)
        return time.perf_counter() - t0, time.thread_time() - c0, nbytes

    def _start_pull(self, k: int) -> tuple[float, float, int]:
        """Start the step's pull stream (runtime/streams.py): groups in forward order (embedding, each layer, head) on
        every rank, at most `pull_window` groups this rank receives into in flight; the forward pre-hook of each
        module completes the groups up to its own, so later layers' parameters travel while earlier layers compute
        (Hydraulis Fig. 11) and the buffers in flight stay bounded."""
        t0, c0 = time.perf_counter(), time.thread_time()
        if self._flat[k] is not None:
            self._flat[k].alloc_params()
        held = held_params(self.models[k], self.spec) if self.models[k] is not None else None
        groups = self.pull_groups[k]

        def post(g: int):
            idx, plan = groups[g]
            inputs = [self.master[i].to(self.compute_dtype) for i in idx]
            return start(plan, inputs, self.groups, dtype=self.compute_dtype, device=self.device, checked=True)

        def land(g: int, outs) -> None:
            if held is not None:
                with torch.no_grad():
                    for i, x in zip(groups[g][0], outs):
                        if held[i] is not None:
                            held[i].copy_(x)

        self._pulling = PullStream(self.pull_receives[k], self.cfg.pull_window, post, land)
        nbytes = sum(_bytes(plan, self.rank) for _, plan in groups)
        return time.perf_counter() - t0, time.thread_time() - c0, nbytes

    def _complete(self, g: int) -> float:
        """Complete the pull up to group g (blocking, in order); returns CPU seconds."""
        c0 = time.thread_time()
        self._pulling.need(g)
        return time.thread_time() - c0

    def _install_hooks(self, model: torch.nn.Module, k: int) -> None:
        for prefix, g in self.module_group.items():
            mod = model.get_submodule(prefix) if _has_submodule(model, prefix) else None
            if mod is None:
                continue
            if prefix == "output" and self.spec.tie_embeddings:
                g = 0  # the tied head is the embedding table's group
            mod.register_forward_pre_hook(lambda _m, _a, g=g, k=k: self._hook(k, g))

    def _hook(self, k: int, g: int) -> None:
        if self._active == k and self._pulling is not None:
            self._pull_wait_cpu += self._complete(g)

    def _grad_hook(self, k: int, g: int) -> None:
        """A gradient hook of group g fired (one per parameter per micro-batch's backward); after the last one the
        group's gradients are final and its push may be posted (never blocking: PushStream.advance)."""
        if self._active != k or self._pushing is None or not self.cfg.overlap_push:
            return
        left = self._hooks_left[g] - 1
        self._hooks_left[g] = left
        if left == 0 and g not in self._late:
            self._pushing.final(len(self.group_index) - 1 - g)  # push order is the pull's reversed
        else:
            self._pushing.advance()

    def _start_push(self, k: int, micro_batches: int) -> None:
        """Arm the push stream for the step's backward: group q (push order) is final on this rank after
        `micro_batches` hooks of each of its parameters here; groups holding no gradient here are ready at once."""
        flat, model = self._flat[k], self.models[k]
        self._push_grads = [None] * len(self.table)
        groups = self.push_groups[k]
        held = held_params(model, self.spec) if model is not None else [None] * len(self.table)
        n_groups = len(self.group_index)
        per_group = [0] * n_groups
        for g, idx in enumerate(self.group_index):
            per_group[g] = len({id(held[i]) for i in idx if held[i] is not None})
        # sequence parallelism all-reduces norm-weight gradients over TP after the schedule: those groups wait
        ids = {id(p) for p in sequence_parallel_partials(model)} if model is not None else set()
        self._late = {g for g, idx in enumerate(self.group_index) if any(id(held[i]) in ids for i in idx)}
        self._hooks_left = [n * micro_batches if micro_batches else -1 for n in per_group]

        def post(q: int):
            idx, plan = groups[q]
            g = n_groups - 1 - q
            if flat is not None and g in flat.grads:
                flat.alloc_grads(g)  # zeros where no backward reached it (a pipeline without sequences)
            inputs = [None if held[i] is None else held[i].main_grad.to(self.master_dtype) for i in idx]
            fl = start(plan, inputs, self.groups, dtype=self.master_dtype, device=self.device, checked=True)
            del inputs
            if flat is not None and g in flat.grads:
                flat.free_grads(g)  # posted: sends are packed and a root's own addend copied
            return fl

        def land(q: int, outs) -> None:
            for i, x in zip(groups[q][0], outs):
                self._push_grads[i] = x
            if self.probe is not None and not self._pushing.in_backward:  # never while an autograd graph lives
                self.probe("push")

        self._pushing = PushStream([per_group[n_groups - 1 - q] > 0 for q in range(n_groups)],
                                   self.cfg.push_window, post, land,
                                   gate=lambda: self._pulling is None or self._pulling.all_posted)

    def _push(self, k: int) -> tuple[list[torch.Tensor], float, float, int]:
        """Finish the push stream after the backward: post the groups the backward did not (window full, or final only
        now) and wait every group in the fixed push order (head first). Gradients travel and are summed in the master
        dtype (fp32 reduction; decision 73)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self._pushing.finish()
        grads, self._push_grads = self._push_grads, []
        nbytes = sum(_bytes(plan, self.rank) for _, plan in self.push_groups[k])
        return grads, time.perf_counter() - t0, time.thread_time() - c0, nbytes

    def warm_up(self, length: int = 256) -> None:
        """Run every candidate once (pull, forward and backward of one `length`-token sequence per pipeline; no push,
        no optimizer step, parameters and moments untouched), so first-use costs (allocations, page faults, kernel
        selection) are not charged to whichever step first uses a strategy. Collective: every rank calls it."""
        g = torch.Generator().manual_seed(self.cfg.seed)
        for k, strategy in enumerate(self.candidates):
            pipes = tuple(PipelinePlan(p.scheme.tp, p.scheme.pp, p.scheme.cp, p.devices, length, ((j,),), 0.0,
                                       ("per-doc",) if p.scheme.cp > 1 else (), p.scheme.layer_split)
                          for j, p in enumerate(strategy.pipelines))
            n = len(pipes)
            plan = StepPlan(tuple(range(n)), (length,) * n, k, pipes, (), 0.0, 0.0)
            toks = torch.randint(0, self.spec.vocab, (length + 1,), generator=g)
            self.train_step(plan, lambda _j, t=toks: t, update=False)

    def train_step(self, step: StepPlan, fetch: Callable[[int], torch.Tensor], update: bool = True,
                   poison: bool = False) -> StepMetrics:
        """One optimizer step on `step`. `fetch(j)` returns the ``seq_lengths[j] + 1`` token ids of sequence j; it
        is called only for the sequences this rank's pipeline runs. `update=False` stops after the backward (warm-up):
        no push, no optimizer step, gradients dropped. A non-finite loss or gradient on any rank skips the update on
        every rank (``optim["skipped"]``; decision 81). `poison` (a test hook, `[train] inject_nan`) makes this rank's
        gradient shards NaN before the optimizer sees them."""
        t_wall, t_busy, t_proc = time.perf_counter(), time.thread_time(), time.process_time()
        k = step.strategy
        if not 0 <= k < len(self.candidates):
            raise TidalError(f"step plan names candidate {k}; the executor has {len(self.candidates)}")
        strategy = self.candidates[k]
        if len(step.pipelines) != len(strategy.pipelines):
            raise TidalError(f"step plan has {len(step.pipelines)} pipelines; candidate {k} has "
                             f"{len(strategy.pipelines)}")
        running = sorted(i for p in step.pipelines for mb in p.micro_batches for i in mb)
        tokens = sum(step.seq_lengths[i] for i in running)
        self._active, self._pull_wait_cpu = k, 0.0
        rec = reconfig_stats(self.pull_groups, self._last, k, self.rank, torch.finfo(self.compute_dtype).bits // 8) \
            if update else ReconfigStats()
        if update:
            self._last = k
        try:
            return replace(self._step(step, fetch, update, k, tokens, running, (t_wall, t_busy, t_proc), poison),
                           reconfig=rec)
        finally:  # also when the step raises: no stream outlives its step
            self._active, self._pulling, self._pushing = None, None, None

    def _step(self, step: StepPlan, fetch, update: bool, k: int, tokens: int, running, t_start,
              poison: bool = False) -> StepMetrics:
        t_wall, t_busy, t_proc = t_start
        if self.cfg.overlap_pull:
            pull_s, pull_c, pull_b = self._start_pull(k)
        else:
            pull_s, pull_c, pull_b = self._pull(k)
        if self.probe is not None:
            self.probe("pull")
        loss_part, compute, on_device = 0.0, 0.0, False
        model = self.models[k]
        pplan = step.pipelines[self.grids[k][0]] if model is not None else None
        if update:  # gradient hooks post each group's push once its gradients are final (never blocking)
            self._start_push(k, len(pplan.micro_batches) if pplan is not None and tokens > 0 else 0)
        if model is not None:
            j, grid = self.grids[k]
            for p in model.parameters():
                p.grad = None
            if pplan.micro_batches and tokens > 0:
                c0 = time.thread_time()
                docs = {i: fetch(i) for mb in pplan.micro_batches for i in mb}
                res = run_pipeline(model, grid, pplan, step.seq_lengths, docs, global_tokens=tokens,
                                   schedule=self.cfg.schedule, reduce_replicas=False)
                # forward + backward: GPU time between CUDA events on CUDA (decision 141), thread CPU time on the CPU
                compute = res.device_seconds if res.device_seconds is not None else time.thread_time() - c0
                on_device = res.device_seconds is not None
                if self.rank == grid.pipeline.devices[0]:
                    loss_part = res.loss
        if self.cfg.overlap_pull:  # groups this rank only sends, or a pipeline with nothing to run
            t0 = time.perf_counter()
            rest = self._complete(len(self.group_index) - 1)
            pull_c += rest + self._pull_wait_cpu
            if not on_device:
                compute -= self._pull_wait_cpu  # the hooks ran inside forward; count their copies as pull
            pull_s += time.perf_counter() - t0
            self._pulling = None
        flat = self._flat[k]
        if flat is not None:
            if self.probe is not None:
                self.probe("backward")
            flat.free_params()  # the push needs gradients only; the next step pulls again
        if not update:
            if flat is not None:
                flat.free_grads()
            return StepMetrics(0.0, tokens, len(running), 0.0, compute, 0.0, 0.0, pull_s, 0.0, pull_c, 0.0, pull_b,
                               0, {})
        grads, push_s, push_c, push_b = self._push(k)
        overlapped = self._pushing.posted_in_backward
        if flat is not None:
            flat.free_grads()
        optim = {}
        if tokens > 0:  # a step with nothing to train leaves parameters and moments untouched
            if poison:
                grads = [g * float("nan") for g in grads]
            optim = self.optim.step(grads, bad=not math.isfinite(loss_part))
        loss = torch.tensor([loss_part], dtype=torch.float64, device=self.device)
        dist.all_reduce(loss)
        return StepMetrics(float(loss), tokens, len(running), time.thread_time() - t_busy, compute,
                           time.process_time() - t_proc, time.perf_counter() - t_wall, pull_s, push_s, pull_c,
                           push_c, pull_b, push_b, optim, overlapped)


def resolve_device(name: str) -> torch.device:
    """`auto`: this rank's current CUDA device when the process group runs NCCL, else the CPU."""
    if name == "cpu" or (name == "auto" and dist.get_backend() != "nccl"):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TidalError("device cuda requested but no CUDA device is available")
    return torch.device("cuda", torch.cuda.current_device())


__all__ = ["DTYPES", "ExecConfig", "Executor", "StepMetrics", "fetch_from", "held_params", "step_tokens"]
