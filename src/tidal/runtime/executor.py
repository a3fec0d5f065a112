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
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.strategy import Strategy
from tidal.models.attention import describe_backend
from tidal.models.init import derive_seed, init_slice
from tidal.models.llama import fuse_storage, storage_blocks
from tidal.runtime import checkpoint as ckpt
from tidal.runtime.config import compute_dtype_for
from tidal.runtime.groups import GroupCache
from tidal.runtime.optim import OptimConfig, ShardedAdamW, shard_range
from tidal.runtime.pipeline import RankGrid, build_stage_model, held_params, run_pipeline
from tidal.runtime.reshard.execute import execute, start
from tidal.runtime.reshard.local import Links, LocalPlanner

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ExecConfig:
    seed: int = 0  # model initialisation
    master_dtype: str = "float32"  # fp32 master weights and Adam moments (float64 for verification)
    compute_dtype: str = "auto"  # parameters pulled in this dtype; auto: config.compute_dtype_for (bf16 on CUDA)
    schedule: str = "1f1b"
    attn_backend: str = "auto"
    overlap_pull: bool = True  # pull layer by layer in the background; each module waits for its own parameters
    device: str = "auto"  # auto: the current CUDA device under NCCL, else CPU; or "cpu" / "cuda"
    sequence_parallel: bool = False  # Megatron-style SP in every TP group (runtime/tp.py)

    def __post_init__(self) -> None:
        if self.master_dtype not in DTYPES:
            raise TidalError(f"master_dtype must be one of {', '.join(DTYPES)}, got {self.master_dtype!r}")
        if self.compute_dtype not in ("auto", *DTYPES):
            raise TidalError(f"compute_dtype must be one of auto, {', '.join(DTYPES)}, got {self.compute_dtype!r}")
        if self.master_dtype == "bfloat16":
            raise TidalError("master_dtype must be float32 or float64 (bf16 master weights lose updates)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise TidalError(f"device must be auto, cpu or cuda, got {self.device!r}")

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
    compute_busy_s: float  # ... in forward/backward only
    process_busy_s: float  # CPU time of the whole rank process, incl. the communication backend's threads
    wall_s: float
    pull_s: float  # wall time of the pull (includes waiting for the ranks it talks to)
    push_s: float  # wall time of the push (includes waiting for the slowest pipeline to finish its backward)
    pull_cpu_s: float  # this rank's CPU time in the pull
    push_cpu_s: float
    pull_bytes: int  # sent + received by this rank
    push_bytes: int
    optim: dict


class Executor:
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
        self._flat: list[_Flat | None] = []  # per candidate: this rank's stage parameters and gradients
        self._inflight: list = []
        self.probe: Callable[[str], None] | None = None  # memory accounting: called at the pull's and push's peaks
        for k, strategy in enumerate(self.candidates):
            if any(d >= self.world for p in strategy.pipelines for d in p.devices):
                raise TidalError(f"candidate {k} ({strategy}) uses devices beyond the world of {self.world}")
            pull_groups, push_groups = self._plan_candidate(k)
            self.pull_groups.append(pull_groups)
            self.push_groups.append(push_groups)
            mine = [j for j, p in enumerate(strategy.pipelines) if self.rank in p.devices]
            if not mine:
                self.grids.append(None)
                self.models.append(None)
                self._flat.append(None)
                continue
            grid = RankGrid.build(strategy.pipelines[mine[0]], self.rank, self.groups)
            model = build_stage_model(spec, grid, seed=cfg.seed, attn_backend=cfg.attn_backend,
                                      dtype=self.compute_dtype, device=self.device, init=False,  # pulled each step
                                      sequence_parallel=cfg.sequence_parallel)
            self._check_layout(model, pull_groups, k)
            self.grids.append((mine[0], grid))
            self.models.append(model)
            self._flat.append(_Flat(model, self.grad_dtype))  # idle until its step: no storage
            if cfg.overlap_pull:
                self._install_hooks(model, k)
        # the attention kernel every stage runs, with why faster ones were passed over (reported in the step rows)
        self.attn_backend = describe_backend(cfg.attn_backend, self.device, self.compute_dtype)
        self._active: int | None = None
        self._pull_wait_cpu = 0.0
        self._init_master()

    def _plan_candidate(self, k: int):
        """Candidate k's pull per parameter group (forward order) and its push per parameter group (backward order:
        the head first, the embedding last), the one order every rank posts them in. This rank's parts only (decision
        74): LNK pulls and pushes are point-to-point, so they need no process group beyond the p2p group."""
        planner = LocalPlanner(self.spec, self.candidates[k], self.world, self.rank, self._links, self.table)
        pull_size, push_size = torch.finfo(self.compute_dtype).bits // 8, torch.finfo(self.master_dtype).bits // 8
        pulls = [(idx, planner.pull(idx, itemsize=pull_size)) for idx in self.group_index]
        pushes = [(idx, planner.push(idx, itemsize=push_size)) for idx in reversed(self.group_index)]
        return pulls, pushes

    def _check_layout(self, model: torch.nn.Module, pulls, k: int) -> None:
        """The runtime's module shards and the engine's annotations must agree on every parameter's local shape."""
        held = held_params(model, self.spec)
        for idx, plan in pulls:
            for i, mv in zip(idx, plan.moves):
                want = mv.dst.local_shape(self.rank, self.table[i].shape)
                got = None if held[i] is None else tuple(held[i].shape)
                if want != got:
                    raise TidalError(f"candidate {k}: {self.table[i].name} on rank {self.rank} is {got} in the model "
                                     f"but {want} in the resharding plan")

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
        """Post every parameter group's pull messages at once (embedding, each layer, head, in that order on every
        rank); the forward pre-hook of each module completes its group just before the module first runs, so later
        layers' parameters travel while earlier layers compute (Hydraulis Fig. 11)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        if self._flat[k] is not None:
            self._flat[k].alloc_params()
        held = held_params(self.models[k], self.spec) if self.models[k] is not None else None
        self._inflight = []
        for idx, plan in self.pull_groups[k]:
            inputs = [self.master[i].to(self.compute_dtype) for i in idx]
            fl = start(plan, inputs, self.groups, dtype=self.compute_dtype, device=self.device)
            self._inflight.append((idx, fl, held))
        nbytes = sum(_bytes(plan, self.rank) for _, plan in self.pull_groups[k])
        return time.perf_counter() - t0, time.thread_time() - c0, nbytes

    def _complete(self, g: int) -> float:
        """Finish group g's pull (if still in flight) and copy it into the module parameters; returns CPU seconds."""
        if g >= len(self._inflight) or self._inflight[g] is None:
            return 0.0
        idx, fl, held = self._inflight[g]
        c0 = time.thread_time()
        outs = fl.wait()
        if held is not None:
            with torch.no_grad():
                for i, x in zip(idx, outs):
                    if held[i] is not None:
                        held[i].copy_(x)
        self._inflight[g] = None  # its buffers go now, not at the end of the step
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
        if self._active == k:
            self._pull_wait_cpu += self._complete(g)

    def _push(self, k: int) -> tuple[list[torch.Tensor], float, float, int]:
        """Gradients to their owner shards, one parameter group at a time in the fixed push order (head first, the
        embedding last), each group's buffers gone before the next group's are made. Gradients travel and are summed
        in the master dtype (fp32 reduction; decision 73): the fp32 accumulation buffers are the inputs, no copy."""
        t0, c0 = time.perf_counter(), time.thread_time()
        held = held_params(self.models[k], self.spec) if self.models[k] is not None else [None] * len(self.table)
        grads: list = [None] * len(self.table)
        nbytes = 0
        for idx, plan in self.push_groups[k]:
            inputs = [None if held[i] is None else held[i].main_grad.to(self.master_dtype) for i in idx]
            outs = execute(plan, inputs, self.groups, dtype=self.master_dtype, device=self.device)
            for i, g in zip(idx, outs):
                grads[i] = g
            del inputs, outs
            nbytes += _bytes(plan, self.rank)
            if self.probe is not None:
                self.probe("push")
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
        if self.cfg.overlap_pull:
            self._active, self._pull_wait_cpu = k, 0.0
            pull_s, pull_c, pull_b = self._start_pull(k)
        else:
            pull_s, pull_c, pull_b = self._pull(k)
        if self.probe is not None:
            self.probe("pull")
        loss_part, compute = 0.0, 0.0
        model = self.models[k]
        if model is not None:
            j, grid = self.grids[k]
            pplan = step.pipelines[j]
            for p in model.parameters():
                p.grad = None
            if pplan.micro_batches and tokens > 0:
                c0 = time.thread_time()
                docs = {i: fetch(i) for mb in pplan.micro_batches for i in mb}
                res = run_pipeline(model, grid, pplan, step.seq_lengths, docs, global_tokens=tokens,
                                   schedule=self.cfg.schedule, reduce_replicas=False)
                compute = time.thread_time() - c0
                if self.rank == grid.pipeline.devices[0]:
                    loss_part = res.loss
        if self.cfg.overlap_pull:  # groups this rank only sends, or a pipeline with nothing to run
            t0 = time.perf_counter()
            rest = sum(self._complete(g) for g in range(len(self._inflight)))
            pull_c += rest + self._pull_wait_cpu
            compute -= self._pull_wait_cpu  # the hooks ran inside forward; count their copies as pull
            pull_s += time.perf_counter() - t0
            self._active, self._inflight = None, []
        flat = self._flat[k]
        if flat is not None:
            flat.alloc_grads()  # (a no-op where the backward already made them)
            if self.probe is not None:
                self.probe("backward")
            flat.free_params()  # the push needs gradients only; the next step pulls again
        if not update:
            if flat is not None:
                flat.free_grads()
            return StepMetrics(0.0, tokens, len(running), 0.0, compute, 0.0, 0.0, pull_s, 0.0, pull_c, 0.0, pull_b,
                               0, {})
        grads, push_s, push_c, push_b = self._push(k)
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
                           push_c, pull_b, push_b, optim)

    def save_checkpoint(self, path: str, step: int, state: dict | None = None) -> None:
        """Collective: every rank writes its master and moment rows (runtime/checkpoint.py); rank 0 adds `state`
        (JSON-safe: the planner's and the data's resumable state) and publishes the directory."""
        if self.rank == 0:
            ckpt.create_files(path, self.spec, self.master_dtype)
        dist.barrier()
        for i, info in enumerate(self.table):
            rows = shard_range(info.shape[0], self.world, self.rank)
            for kind, tensors in (("params", self.optim.params), ("m", self.optim.m), ("v", self.optim.v)):
                ckpt.write_rows(path, kind, i, rows, tensors[i])
        dist.barrier()
        if self.rank == 0:
            ckpt.finish(path, self.spec, self.master_dtype, step=step, optimizer_steps=self.optim.steps,
                        world=self.world, state=state or {})
        dist.barrier()

    def load_checkpoint(self, path: str) -> dict:
        """Every rank reads its rows of the master weights and moments (whatever world size wrote them); returns the
        checkpoint's metadata (step, state)."""
        meta = ckpt.load_meta(path, self.spec)
        ranges = [shard_range(info.shape[0], self.world, self.rank) for info in self.table]
        got = ckpt.tensors_rows(path, self.spec, ranges, dtype=self.master_dtype, device=self.device)
        with torch.no_grad():
            for kind, tensors in (("params", self.optim.params), ("m", self.optim.m), ("v", self.optim.v)):
                for t, g in zip(tensors, got[kind]):
                    t.copy_(g)
        self.optim.steps = int(meta["optimizer_steps"])
        return meta

    def gather_state(self) -> dict[str, dict[str, np.ndarray]] | None:
        """Full master parameters and Adam moments on rank 0 (None elsewhere): for verification and checkpoints."""
        out: dict[str, dict[str, np.ndarray]] = {"params": {}, "m": {}, "v": {}}
        for key, tensors in (("params", self.optim.params), ("m", self.optim.m), ("v", self.optim.v)):
            parts: list = [None] * self.world
            dist.all_gather_object(parts, [t.detach().cpu().numpy() for t in tensors])
            for i, info in enumerate(self.table):
                out[key][info.name] = np.concatenate([parts[r][i] for r in range(self.world)])
        return out if self.rank == 0 else None


class _Flat:
    """One candidate's stage on this rank: its parameters (compute dtype) are views of one flat buffer and their
    gradients (`main_grad`, at least fp32) views of another at the same offsets. Each buffer holds storage only while
    the candidate's step needs it (storage resized to zero otherwise), so idle candidates hold nothing. Fused blocks
    (q/k/v, gate/up) are adjacent, so their GEMM reads one tensor without a copy and their gradient blocks are views
    of one fused gradient. A post-accumulate hook adds each micro-batch's `.grad` into `main_grad` and drops it."""

    ALIGN = 64  # elements: every block starts at a multiple (aligned GEMM operands)

    def __init__(self, model: torch.nn.Module, grad_dtype: torch.dtype) -> None:
        blocks = storage_blocks(model)
        offsets, off = [], 0
        for b in blocks:
            offsets.append(off)
            off += sum(p.numel() for p in b)
            off = -(-off // self.ALIGN) * self.ALIGN
        p0 = blocks[0][0]
        self.params = torch.empty(off, dtype=p0.dtype, device=p0.device)
        self.grads = torch.empty(off, dtype=grad_dtype, device=p0.device)
        for b, o in zip(blocks, offsets):
            n = sum(p.numel() for p in b)
            fuse_storage(b, self.params[o:o + n])
            for p in b:
                p.main_grad = self.grads[o:o + p.numel()].view_as(p)
                p.register_post_accumulate_grad_hook(self._accumulate)
                o += p.numel()
        self._grads_live = True
        self.free_params()
        self.free_grads()

    def _accumulate(self, p: torch.nn.Parameter) -> None:
        self.alloc_grads()
        p.main_grad.add_(p.grad)
        p.grad = None

    def alloc_params(self) -> None:
        st = self.params.untyped_storage()
        if st.nbytes() == 0:
            st.resize_(self.params.numel() * self.params.element_size())

    def free_params(self) -> None:
        self.params.untyped_storage().resize_(0)

    def alloc_grads(self) -> None:
        if not self._grads_live:
            self.grads.untyped_storage().resize_(self.grads.numel() * self.grads.element_size())
            self.grads.zero_()
            self._grads_live = True

    def free_grads(self) -> None:
        self.grads.untyped_storage().resize_(0)
        self._grads_live = False


def resolve_device(name: str) -> torch.device:
    """`auto`: this rank's current CUDA device when the process group runs NCCL, else the CPU."""
    if name == "cpu" or (name == "auto" and dist.get_backend() != "nccl"):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TidalError("device cuda requested but no CUDA device is available")
    return torch.device("cuda", torch.cuda.current_device())


def _param_groups(table) -> tuple[list[list[int]], dict[str, int]]:
    """Pull groups in forward order: the embedding, each layer, the final norm and head; and the module prefix whose
    forward pre-hook completes each group."""
    groups: dict[str, list[int]] = {}
    for i, info in enumerate(table):
        key = {"embed": "tok_embeddings", "head": "head"}.get(str(info.owner), f"layers.{info.owner}")
        groups.setdefault(key, []).append(i)
    order = list(groups)
    module_group = {prefix: order.index(prefix) for prefix in order if prefix != "head"}
    if "head" in groups:
        module_group["norm"] = order.index("head")
        module_group["output"] = order.index("head")
    return [groups[k] for k in order], module_group


def _has_submodule(model: torch.nn.Module, prefix: str) -> bool:
    try:
        return model.get_submodule(prefix) is not None
    except AttributeError:
        return False


def _bytes(plan, rank: int) -> int:
    st = plan.stats.get(rank)
    return 0 if st is None else st.send + st.recv


def step_tokens(step: StepPlan) -> int:
    return sum(step.seq_lengths[i] for p in step.pipelines for mb in p.micro_batches for i in mb)


def fetch_from(docs: Sequence[tuple[int, int, int]], corpus) -> Callable[[int], torch.Tensor]:
    """`fetch` for Executor.train_step over a token corpus: sequence j is (doc_id, start, length) of `docs`."""

    def fetch(j: int) -> torch.Tensor:
        doc, start, length = docs[j]
        return torch.from_numpy(np.asarray(corpus.tokens(doc, start, length), dtype=np.int64))

    return fetch


__all__ = ["DTYPES", "ExecConfig", "Executor", "StepMetrics", "fetch_from", "held_params", "step_tokens"]
