"""Tensor parallelism (Megatron-style, optionally with sequence parallelism): parallel linears, vocab-parallel
embedding and cross-entropy, and `parallelize_tp`, which swaps a plain Llama's modules for sharded ones in place.

Sharding: ``wq/wk/wv`` (whole heads), ``w1/w3`` and the output head are column-parallel (output dim split);
``wo``/``w2`` are row-parallel (input dim split, partial sums reduced); the embedding is split over the vocabulary.
Logits stay vocabulary-sharded and go straight into :func:`vocab_parallel_loss_sum`.

Communication per decoder layer (`fused`, the default): one collective where each sublayer's input enters the TP
region and one where its output leaves it, installed as the model's ``tp_in``/``tp_out`` hooks (:class:`TPRegion`),
while the model runs q/k/v and gate/up as one GEMM each over one fused local storage
``[wq_shard; wk_shard; wv_shard]`` (``[w1_shard; w3_shard]``) whose row blocks are the named parameters
(models/llama.py `fuse_storage`). Without sequence parallelism that is Megatron's f/g pair:
2 all-reduces in forward (after ``wo`` and ``w2``) and 2 in backward (the input gradients of the attention and MLP
inputs). ``fused=False`` is the unfused baseline, each column-parallel projection all-reducing its own input
gradient: 2 in forward, 5 in backward (tests/runtime/test_tp_comm.py counts both).

Sequence parallelism (``sequence_parallel=True``, Megatron-LM's SP): between sublayers every TP rank keeps only
``seq_rows(T, tp)`` rows of the residual stream (its layout TP index picks the block; the last block is zero-padded),
so norms, residual adds and pipeline sends work on 1/tp of the tokens. Entering a sublayer all-gathers the sequence,
leaving it reduce-scatters: 2 all-gathers and 2 reduce-scatters per layer in forward, the same in backward, the
same bytes as the all-reduces they replace. Norm weights then see only their rank's tokens, so their gradients are
partial over TP; `run_pipeline` sums them over the TP group (one coalesced all-reduce per step), which keeps the
engine's annotation (norm gradients duplicated over TP) true. Without SP, norm weights receive identical gradients on
every TP rank (their inputs and output gradients are replicated) and need no sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tidal.core.errors import TidalError
from tidal.models.llama import fuse_storage, upcast
from tidal.runtime.comm import (
    all_reduce_,
    copy_to_group,
    gather_from_sequence,
    group_size,
    reduce_from_group,
    scatter_to_sequence,
    seq_rows,
)


def _shard(w: torch.Tensor, dim: int, group, rank: int) -> torch.Tensor:
    """Shard `rank` of `w` along `dim`. `rank` is the pipeline-layout TP rank (RankGrid.tp_rank), which the resharding
    engine also uses; it is *not* the group rank (torch orders groups by global rank)."""
    n, r = group_size(group), rank
    if not 0 <= r < n:
        raise TidalError(f"TP rank {r} out of range for TP={n}")
    if w.shape[dim] % n:
        raise TidalError(f"TP={n} does not divide dimension {w.shape[dim]} of a {tuple(w.shape)} weight")
    return w.detach().chunk(n, dim=dim)[r].clone()


class ColumnParallelLinear(nn.Module):
    """y_local = x @ W[rows of this rank]^T; with `communicate`, the input gradient is all-reduced over the group
    (otherwise the enclosing TPRegion does it once for all projections that share the input)."""

    shard_dim = 0

    def __init__(self, linear: nn.Linear, group, rank: int, communicate: bool = True) -> None:
        super().__init__()
        self.group = group if communicate else None
        self.weight = nn.Parameter(_shard(linear.weight, 0, group, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_group(x, self.group), self.weight)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local @ W[:, columns of this rank]^T); without `communicate` the partial sum is returned and
    the enclosing TPRegion reduces it."""

    shard_dim = 1

    def __init__(self, linear: nn.Linear, group, rank: int, communicate: bool = True) -> None:
        super().__init__()
        self.group = group if communicate else None
        self.weight = nn.Parameter(_shard(linear.weight, 1, group, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_group(F.linear(x, self.weight), self.group)


class TPRegion:
    """The model's ``tp_in``/``tp_out`` hooks and ``Llama.seq_parallel`` for one TP group: Megatron's f/g
    (copy in, all-reduce out) or, with `sequence_parallel`, all-gather in and reduce-scatter out along the tokens.
    `slots[t]` is layout TP rank t's rank in `group` (RankGrid.tp_slots): sequence blocks follow the layout, so a
    pipeline stage's TP rank t sends its block to the next stage's TP rank t whatever the groups' rank order."""

    def __init__(self, group, slots: tuple[int, ...], sequence_parallel: bool) -> None:
        self.group, self.slots, self.sp = group, tuple(slots), bool(sequence_parallel)
        self.world = group_size(group)

    def enter(self, x: torch.Tensor, tokens: int) -> torch.Tensor:
        return gather_from_sequence(x, self.group, self.slots, tokens) if self.sp else copy_to_group(x, self.group)

    def exit(self, y: torch.Tensor, tokens: int) -> torch.Tensor:
        del tokens
        return scatter_to_sequence(y, self.group, self.slots) if self.sp else reduce_from_group(y, self.group)

    # Llama.seq_parallel interface (sequence parallelism only)
    def rows(self, tokens: int) -> int:
        return seq_rows(tokens, self.world)

    def gather(self, h: torch.Tensor, tokens: int) -> torch.Tensor:
        return gather_from_sequence(h, self.group, self.slots, tokens)


class VocabParallelEmbedding(nn.Module):
    """Each rank holds rows [start, start + V/tp) of the table; tokens outside it contribute zeros; summed."""

    shard_dim = 0

    def __init__(self, emb: nn.Embedding, group, rank: int, region: TPRegion | None = None) -> None:
        super().__init__()
        self.group = group
        self.region = region  # sequence parallelism: reduce-scatter the rows instead of all-reducing them
        self.weight = nn.Parameter(_shard(emb.weight, 0, group, rank))
        self.vocab_start = rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside[:, None], 0.0)
        if self.region is not None and self.region.sp:
            return self.region.exit(out, ids.shape[0])
        return reduce_from_group(out, self.group)


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, group, vocab_start):
        x = upcast(logits)
        m = all_reduce_(x.max(dim=-1).values, group, op=torch.distributed.ReduceOp.MAX)
        z = x - m[:, None]
        e = z.exp()
        s = all_reduce_(e.sum(dim=-1), group)
        local = labels - vocab_start
        inside = (local >= 0) & (local < x.shape[-1])
        li = local.masked_fill(~inside, 0)
        picked = z.gather(1, li[:, None])[:, 0].masked_fill(~inside, 0.0)
        picked = all_reduce_(picked, group)
        ctx.save_for_backward(e / s[:, None], li, inside)
        ctx.in_dtype = logits.dtype
        return s.log() - picked

    @staticmethod
    def backward(ctx, g):
        p, li, inside = ctx.saved_tensors
        grad = p.clone()
        grad[torch.arange(grad.shape[0], device=grad.device), li] -= inside.to(grad.dtype)
        return (grad * g[:, None]).to(ctx.in_dtype), None, None, None


def vocab_parallel_loss_sum(logits: torch.Tensor, labels: torch.Tensor, group, vocab_start: int) -> torch.Tensor:
    """Sum over tokens of cross-entropy on vocabulary-sharded logits [T, V/tp]."""
    if group_size(group) == 1:
        return F.cross_entropy(upcast(logits), labels, reduction="sum")
    return _VocabParallelCE.apply(logits, labels, group, vocab_start).sum()


def parallelize_tp(model: nn.Module, group, rank: int, *, slots: tuple[int, ...] | None = None, fused: bool = True,
                   sequence_parallel: bool = False) -> nn.Module:
    """Swap a plain (possibly stage-split) Llama's modules for TP-sharded ones over `group`, in place; this rank holds
    shard `rank` (its layout TP rank) of every split weight. `slots` maps layout TP ranks to group ranks (identity when
    None). See the module docstring for `fused` and `sequence_parallel`."""
    tp = group_size(group)
    if tp == 1:
        return model
    if sequence_parallel and not fused:
        raise TidalError("sequence parallelism needs fused projections (one all-gather per sublayer input)")
    spec = model.spec
    for name, n in (("heads", spec.heads), ("kv_heads", spec.kv_heads), ("ffn", spec.ffn), ("vocab", spec.vocab)):
        if n % tp:
            raise TidalError(f"TP={tp} does not divide {name}={n} of model {spec.name}")
    region = TPRegion(group, tuple(range(tp)) if slots is None else slots, sequence_parallel)
    comm = not fused  # unfused: every projection communicates alone (the baseline the collective counts compare to)
    for layer in model.layers.values():
        a, f = layer.attention, layer.feed_forward
        a.wq, a.wk, a.wv = (ColumnParallelLinear(m, group, rank, comm) for m in (a.wq, a.wk, a.wv))
        a.wo = RowParallelLinear(a.wo, group, rank, comm)
        f.w1, f.w3 = ColumnParallelLinear(f.w1, group, rank, comm), ColumnParallelLinear(f.w3, group, rank, comm)
        f.w2 = RowParallelLinear(f.w2, group, rank, comm)
        a.fused = f.fused = fused
        if fused:
            a.tp_in, a.tp_out, f.tp_in, f.tp_out = region.enter, region.exit, region.enter, region.exit
        # this rank's fused storages are [wq_shard; wk_shard; wv_shard] and [w1_shard; w3_shard] (each projection is
        # still split over TP alone, so names and annotations are per projection; decision 72)
        fuse_storage(a.fused_params())
        fuse_storage(f.fused_params())
    if model.tok_embeddings is not None:
        model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings, group, rank, region)
    if model.output is not None:
        # under SP the head's input is gathered (Llama.seq_parallel), whose backward already sums over the group
        model.output = ColumnParallelLinear(model.output, group, rank, communicate=not sequence_parallel)
        if spec.tie_embeddings and model.tok_embeddings is not None:
            model.output.weight = model.tok_embeddings.weight
    if sequence_parallel:
        model.seq_parallel = region
    return model


def sequence_parallel_partials(model: nn.Module) -> list[nn.Parameter]:
    """Parameters whose gradient is partial over TP: under sequence parallelism, the replicated (norm) weights, which
    each TP rank sees only on its block of tokens. Empty otherwise."""
    if getattr(model, "seq_parallel", None) is None:
        return []
    split = set(tp_shard_dims(model))
    return [p for n, p in model.named_parameters() if n not in split]


def tp_shard_dims(model: nn.Module) -> dict[str, int]:
    """Parameter name -> the dimension it is split along over TP (absent: replicated)."""
    out = {}
    for mname, m in model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
            out[f"{mname}.weight"] = m.shard_dim
    return out
