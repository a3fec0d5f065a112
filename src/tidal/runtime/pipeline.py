"""One pipeline's rank grid and runner.

:class:`RankGrid` names this rank's coordinates in a :class:`tidal.core.Pipeline` (device of (stage s, cp c, tp t) is
``devices[(s * cp + c) * tp + t]``: TP fastest, then CP, then stage) and holds the groups it talks over, built from
that layout with Megatron-style offsets. Groups come from a caller-owned :class:`GroupCache`, so several pipelines (or
several schemes in turn) can share one world without any global state.

:func:`run_pipeline` executes one pipeline's share of a step plan (its ``PipelinePlan``: micro-batches and per
micro-batch CP sharding) and leaves this rank's gradients in ``.grad``. The loss is normalised per token over the whole
global batch: every micro-batch contributes ``sum of token cross-entropies / global_tokens``, so the gradient is the
same however the global batch is split into pipelines, micro-batches, CP shards or TP shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tidal.core.attnrule import H200_RULE, AttnBackendRule
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.core.plan import PipelinePlan
from tidal.core.strategy import Pipeline
from tidal.models.init import derive_seed, init_slice
from tidal.models.llama import Llama, batch_to_device, loss_sum
from tidal.planner.cp_sharding import shard_micro_batch
from tidal.runtime.comm import all_reduce_
from tidal.runtime.cp import apply_cp, cp_rank_batch
from tidal.runtime.groups import GroupCache, slot_in_group
from tidal.runtime.pp import SCHEDULES, Link, execute, split_stage
from tidal.runtime.tp import parallelize_tp, sequence_parallel_partials, vocab_parallel_loss_sum


@dataclass(frozen=True)
class RankGrid:
    pipeline: Pipeline
    rank: int
    stage: int
    cp_rank: int
    tp_rank: int
    tp_group: object
    cp_group: object
    pipe_group: object  # every rank of the pipeline (loss reporting)
    embed_group: object  # first and last stage at this (cp, tp), for tied embeddings with PP > 1
    prev_rank: int | None
    next_rank: int | None
    cp_slots: tuple[int, ...] = (0,)  # layout CP rank c -> its slot in cp_group (torch orders groups by global rank)
    tp_slots: tuple[int, ...] = (0,)  # layout TP rank t -> its slot in tp_group
    prev_group: object = None  # the (previous stage, this stage) pair's group: activations and their gradients
    next_group: object = None  # the (this stage, next stage) pair's group

    @property
    def scheme(self):
        return self.pipeline.scheme

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.scheme.pp - 1

    @staticmethod
    def build(pipeline: Pipeline, rank: int, groups: GroupCache) -> RankGrid:
        """This rank's grid in `pipeline` (global ranks = device ids); its groups must already be in `groups`."""
        s = pipeline.scheme
        if rank not in pipeline.devices:
            raise TidalError(f"rank {rank} is not one of the pipeline's devices {pipeline.devices}")
        flat = pipeline.devices.index(rank)
        stage, rest = divmod(flat, s.cp * s.tp)
        c, t = divmod(rest, s.tp)
        dev = pipeline.device
        tp_group = groups.get([dev(stage, c, x) for x in range(s.tp)])
        cp_group = groups.get([dev(stage, x, t) for x in range(s.cp)])
        pipe_group = groups.get(pipeline.devices)
        embed_group = groups.get([dev(0, c, t), dev(s.pp - 1, c, t)]) if s.pp > 1 else None
        return RankGrid(
            pipeline=pipeline, rank=rank, stage=stage, cp_rank=c, tp_rank=t, tp_group=tp_group, cp_group=cp_group,
            pipe_group=pipe_group, embed_group=embed_group,
            prev_rank=dev(stage - 1, c, t) if stage > 0 else None,
            next_rank=dev(stage + 1, c, t) if stage < s.pp - 1 else None,
            prev_group=groups.get([dev(stage - 1, c, t), rank]) if stage > 0 else None,
            next_group=groups.get([rank, dev(stage + 1, c, t)]) if stage < s.pp - 1 else None,
            cp_slots=tuple(slot_in_group([dev(stage, x, t) for x in range(s.cp)], dev(stage, y, t))
                           for y in range(s.cp)),
            tp_slots=tuple(slot_in_group([dev(stage, c, x) for x in range(s.tp)], dev(stage, c, y))
                           for y in range(s.tp)),
        )


def held_params(model: nn.Module, spec: ModelSpec) -> list[nn.Parameter | None]:
    """This rank's module parameter for every entry of `param_table(spec)` (None where the stage holds none). The
    last stage's head of a tied embedding stands for the table's `tok_embeddings.weight`."""
    named = dict(model.named_parameters())
    out = []
    for info in param_table(spec):
        p = named.get(info.name)
        if p is None and info.tied_head:
            p = named.get("output.weight")
        out.append(p)
    return out


def build_stage_model(spec: ModelSpec, grid: RankGrid, *, seed: int = 0, attn_backend: str = "auto",
                      attn_rule: AttnBackendRule = H200_RULE,
                      dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                      init: bool = True, fused: bool = True, sequence_parallel: bool = False,
                      checkpoint: str | None = None, recompute: str = "none", offload: bool = False,
                      compile: str = "off") -> Llama:
    """This rank's stage of the model, TP-sharded, with the CP hook installed. Built on the meta device and then
    materialised: a rank allocates only its stage's layers and its TP shard, never the whole model. With `init`,
    each shard is initialised alone (models/init.py) to exactly the slice of `torch.manual_seed(seed); Llama(spec)`;
    the executor passes init=False because every parameter is pulled before use. Names stay the full model's.
    `fused` and `sequence_parallel` are tensor parallelism's options (runtime/tp.py). With `checkpoint` (a directory
    of runtime/checkpoint.py), each shard is read from the checkpoint's master weights through the same per-slice
    path instead of being drawn, so loading never materialises the whole model either. `recompute` ("none", "full",
    "selective") applies to every layer of the stage and `offload` sends every layer's saved activations to host
    memory (models/recompute.py): the mode is a property of the stage, so every rank of its TP and CP groups
    recomputes the same layers (their collectives still match). `compile` "dense" compiles the stage's RMSNorm and
    SwiGLU gate (models/dense.py): pure elementwise functions, so the collectives are those of the eager model."""
    grid.scheme.validate(spec)
    init_seed = derive_seed(seed)
    with torch.device("meta"):
        model = Llama(spec, attn_backend, seed=init_seed, attn_rule=attn_rule)
    split_stage(model, grid.scheme.stage_layers(spec.layers), grid.stage)
    model.set_fused(fused)
    parallelize_tp(model, grid.tp_group, grid.tp_rank, slots=grid.tp_slots, fused=fused,
                   sequence_parallel=sequence_parallel)
    apply_cp(model, grid.cp_group)
    model.set_recompute(recompute, offload=[int(i) for i in model.layers] if offload else ())
    model.set_compile(compile)
    model = model.to_empty(device=device).to(dtype)
    if spec.tie_embeddings and model.output is not None and model.tok_embeddings is not None:
        model.output.weight = model.tok_embeddings.weight  # to_empty unties shared parameters
    if checkpoint is not None:
        from tidal.runtime.checkpoint import load_meta, slice_source

        load_meta(checkpoint, spec)
        init_stage(model, spec, init_seed, grid.tp_rank, grid.scheme.tp, source=slice_source(checkpoint))
    elif init:
        init_stage(model, spec, init_seed, grid.tp_rank, grid.scheme.tp)
    return model


def init_stage(model: nn.Module, spec: ModelSpec, init_seed: int, tp_rank: int, tp: int, source=None) -> None:
    """Initialise every parameter a stage holds to its slice (TP shard `tp_rank` of `tp`) of the unsharded model;
    `source(info, index, rows, cols, dtype=, device=)` gives the slices (default: `init_slice` with `init_seed`)."""
    if source is None:
        def source(info, index, rows, cols, *, dtype, device):
            return init_slice(info, index, init_seed, rows, cols, dtype=dtype, device=device)
    with torch.no_grad():
        for i, (info, p) in enumerate(zip(param_table(spec), held_params(model, spec))):
            if p is None:
                continue
            rows = cols = None
            if info.tp_dim is not None and tp > 1:
                n = info.shape[info.tp_dim] // tp
                if info.tp_dim == 0:
                    rows = (tp_rank * n, (tp_rank + 1) * n)
                else:
                    cols = (tp_rank * n, (tp_rank + 1) * n)
            p.copy_(source(info, i, rows, cols, dtype=p.dtype, device=p.device))


@dataclass(frozen=True)
class StepResult:
    loss: float  # sum over this pipeline's micro-batches of token CE / global_tokens (same on every pipeline rank)
    tokens: int  # tokens (= targets) in this pipeline's micro-batches
    peak_live_micro_batches: int
    peak_saved_bytes: int
    forward_seconds: tuple[float, ...] = ()  # per micro-batch on this rank (see ExecStats)
    backward_seconds: tuple[float, ...] = ()
    # on CUDA: GPU time of this rank's forward and backward computations (ExecStats.device_spans, summed after the
    # loss's host sync below, so reading them never waits); None on the CPU
    device_seconds: float | None = None


def _check_plan(plan: PipelinePlan, grid: RankGrid, seq_lengths: Sequence[int], documents: Sequence) -> None:
    s = grid.scheme
    if (plan.tp, plan.pp, plan.cp) != (s.tp, s.pp, s.cp):
        raise TidalError(f"plan is tp{plan.tp}pp{plan.pp}cp{plan.cp} but this pipeline runs {s}")
    if not plan.micro_batches or any(len(mb) == 0 for mb in plan.micro_batches):
        raise TidalError("a pipeline plan needs at least one micro-batch and no empty ones")
    if s.cp > 1 and len(plan.cp_sharding) != len(plan.micro_batches):
        raise TidalError(f"CP={s.cp} needs one cp_sharding entry per micro-batch, got {len(plan.cp_sharding)}")
    for mb in plan.micro_batches:
        for j in mb:
            if not 0 <= j < len(seq_lengths):
                raise TidalError(f"micro-batch index {j} out of range for {len(seq_lengths)} sequences")
            if len(documents[j]) != seq_lengths[j] + 1:
                raise TidalError(f"document {j} has {len(documents[j])} tokens; expected seq_length + 1 = "
                                 f"{seq_lengths[j] + 1} (inputs plus the next-token label)")


def micro_batch_inputs(plan: PipelinePlan, i: int, grid: RankGrid, seq_lengths: Sequence[int],
                       documents: Sequence[torch.Tensor], device: torch.device):
    """(token ids, labels, VarlenBatch) of micro-batch `i` for this rank's CP shard, on `device`. Everything is
    assembled on the host (the documents, the CP shard's indices, positions and segments) and moved in one
    non-blocking copy from pinned memory (:func:`tidal.models.llama.batch_to_device`); the segments' host lists
    travel with it, so nothing in the forward reads device memory back."""
    s = grid.scheme
    mb = plan.micro_batches[i]
    shard = shard_micro_batch([seq_lengths[j] for j in mb], s.cp, plan.cp_sharding[i] if s.cp > 1 else "per-seq")
    idx = torch.from_numpy(shard.ranks[grid.cp_rank].indices)
    for j in mb:
        if documents[j].device.type != "cpu":
            raise TidalError(f"document {j} is on {documents[j].device}; the runner takes token ids on the host")
    inputs = torch.cat([documents[j][:-1] for j in mb]).long()[idx]
    labels = torch.cat([documents[j][1:] for j in mb]).long()[idx]
    batch, (inputs, labels) = batch_to_device(cp_rank_batch(shard, grid.cp_rank, grid.cp_slots), device, inputs,
                                              labels)
    return inputs, labels, batch


def run_pipeline(model: nn.Module, grid: RankGrid, plan: PipelinePlan, seq_lengths: Sequence[int],
                 documents: Sequence[torch.Tensor], *, global_tokens: int | None = None,
                 schedule: str = "1f1b", reduce_replicas: bool = True) -> StepResult:
    """Forward and backward of one pipeline's micro-batches on this rank; gradients accumulate into ``.grad``.

    ``documents[j]`` holds ``seq_lengths[j] + 1`` token ids (inputs ``[:-1]``, next-token labels ``[1:]``), so a
    document of length l yields l training tokens. ``global_tokens`` defaults to this pipeline's own token count;
    pass the whole global batch's count when several pipelines share a step.

    Gradient contract: this call *adds* its micro-batches' gradient to whatever ``.grad`` already holds, exactly
    (calling it twice equals one call over both sets of micro-batches). With ``reduce_replicas`` (default) the
    replicas' partial gradients are summed here: over the CP group, and over the first/last-stage pair of a tied
    embedding with PP > 1. The executor passes ``reduce_replicas=False`` and leaves those partial sums to the push
    of the resharding engine, whose gradient annotations are partial over CP, over the tied pair and over pipelines
    (:func:`tidal.runtime.reshard.deduce.param_annotation`), so no partial is summed twice.

    Parameters with a ``main_grad`` buffer (the executor's, runtime/flat.py ``FlatStage``) accumulate there instead
    of in ``.grad`` (their hooks add every micro-batch's gradient and drop it); the reductions above then act on the
    whole buffer, so the caller hands it in zeroed (the executor calls this once per step).
    """
    _check_plan(plan, grid, seq_lengths, documents)
    if schedule not in SCHEDULES:
        raise TidalError(f"unknown pipeline schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    s = grid.scheme
    tokens = sum(seq_lengths[j] for mb in plan.micro_batches for j in mb)
    norm = float(global_tokens if global_tokens is not None else tokens)
    if norm <= 0:
        raise TidalError(f"global_tokens must be positive, got {global_tokens}")
    device = next(model.parameters()).device  # tokens and the loss follow the model's device
    mbs = [micro_batch_inputs(plan, i, grid, seq_lengths, documents, device) for i in range(len(plan.micro_batches))]

    def stage_forward(i: int, x):
        inputs, _, batch = mbs[i]
        return model(inputs if x is None else x, batch)

    vocab_start = grid.tp_rank * (model.spec.vocab // s.tp)

    def stage_loss(i: int, logits):
        labels = mbs[i][1]
        if s.tp > 1:
            return vocab_parallel_loss_sum(logits, labels, grid.tp_group, vocab_start) / norm
        return loss_sum(logits, labels) / norm

    # hidden-state shape at the stage boundaries, per micro-batch: this CP rank's tokens, or its sequence-parallel
    # rows of them; from the plan, so pp.execute never sends a shape
    seq_par = getattr(model, "seq_parallel", None)
    recv_shapes = [(n if seq_par is None else seq_par.rows(n), model.spec.hidden)
                   for n in (int(inputs.shape[0]) for inputs, _, _ in mbs)]
    params = list(model.parameters())
    dtype = params[0].dtype
    main = [p for p in params if getattr(p, "main_grad", None) is not None]
    if main and len(main) != len(params):
        raise TidalError("either every parameter of a stage has a main_grad buffer or none has")
    earlier = [p.grad for p in params]  # set aside: only this call's contribution is reduced over replicas
    for p in params:
        p.grad = None
    stats = execute(SCHEDULES[schedule](len(mbs), s.pp, grid.stage), stage_forward, stage_loss, first=grid.first,
                    last=grid.last, prev_link=None if grid.first else Link(grid.prev_rank, grid.prev_group),
                    next_link=None if grid.last else Link(grid.next_rank, grid.next_group), recv_shapes=recv_shapes,
                    dtype=dtype, params=params)
    if main:  # the caller's buffers (the executor's fp32 accumulation): hooks added every micro-batch into them
        grads = [p.main_grad for p in params]
    else:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
    grad_of = {id(p): g for p, g in zip(params, grads)}
    sp_partial = [grad_of[id(p)] for p in sequence_parallel_partials(model)]
    if sp_partial:  # norm weights under sequence parallelism: partial over TP whatever reduce_replicas says
        flat = torch.cat([g.reshape(-1) for g in sp_partial])
        all_reduce_(flat, grid.tp_group)
        for g, x in zip(sp_partial, flat.split([g.numel() for g in sp_partial])):
            g.copy_(x.view_as(g))
    if reduce_replicas:
        for g in grads:
            all_reduce_(g, grid.cp_group)  # CP ranks hold replicas: sum their partial gradients
        if s.pp > 1 and model.spec.tie_embeddings:
            tied = model.tok_embeddings.weight if grid.first else model.output.weight
            all_reduce_(grad_of[id(tied)], grid.embed_group)
    for p, g in zip(params, earlier):
        if g is not None and not main:
            g.add_(p.grad)
            p.grad = g
    loss = stats.loss_sum.reshape(1) if (grid.last and grid.tp_rank == 0) else torch.zeros(
        1, dtype=torch.float64, device=device)
    all_reduce_(loss, grid.pipe_group)  # the step's one host sync of the loss is float(loss) below
    loss_value = float(loss)  # the events below were recorded before the loss's reduction: complete once it is read
    device_s = (sum(a.elapsed_time(b) for a, b in stats.device_spans) / 1e3 if stats.device_spans else None)
    return StepResult(loss_value, tokens, stats.peak_live_micro_batches, stats.peak_saved_bytes,
                      stats.forward_seconds, stats.backward_seconds, device_s)
