"""Tensor parallelism (Megatron-style, no sequence parallelism): parallel linears, vocab-parallel embedding and
cross-entropy, and `parallelize_tp`, which swaps a plain Llama's modules for sharded ones in place.

Sharding: ``wq/wk/wv`` (whole heads), ``w1/w3`` and the output head are column-parallel (output dim split);
``wo``/``w2`` are row-parallel (input dim split, partial sums all-reduced); the embedding is split over the vocabulary.
Logits stay vocabulary-sharded and go straight into :func:`vocab_parallel_loss_sum`. Norm weights are replicated and
receive identical gradients on every TP rank (their inputs and output gradients are replicated), so no TP gradient
sync is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tidal.core.errors import TidalError
from tidal.models.llama import upcast
from tidal.runtime.comm import all_reduce_, copy_to_group, group_size, reduce_from_group


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
    """y_local = x @ W[rows of this rank]^T; input gradient all-reduced over the group."""

    shard_dim = 0

    def __init__(self, linear: nn.Linear, group, rank: int) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(_shard(linear.weight, 0, group, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_group(x, self.group), self.weight)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local @ W[:, columns of this rank]^T)."""

    shard_dim = 1

    def __init__(self, linear: nn.Linear, group, rank: int) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(_shard(linear.weight, 1, group, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_group(F.linear(x, self.weight), self.group)


class VocabParallelEmbedding(nn.Module):
    """Each rank holds rows [start, start + V/tp) of the table; tokens outside it contribute zeros; summed."""

    shard_dim = 0

    def __init__(self, emb: nn.Embedding, group, rank: int) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(_shard(emb.weight, 0, group, rank))
        self.vocab_start = rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside[:, None], 0.0)
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
        grad[torch.arange(grad.shape[0]), li] -= inside.to(grad.dtype)
        return (grad * g[:, None]).to(ctx.in_dtype), None, None, None


def vocab_parallel_loss_sum(logits: torch.Tensor, labels: torch.Tensor, group, vocab_start: int) -> torch.Tensor:
    """Sum over tokens of cross-entropy on vocabulary-sharded logits [T, V/tp]."""
    if group_size(group) == 1:
        return F.cross_entropy(upcast(logits), labels, reduction="sum")
    return _VocabParallelCE.apply(logits, labels, group, vocab_start).sum()


def parallelize_tp(model: nn.Module, group, rank: int) -> nn.Module:
    """Swap a plain (possibly stage-split) Llama's modules for TP-sharded ones over `group`, in place; this rank holds
    shard `rank` (its layout TP rank) of every split weight."""
    tp = group_size(group)
    if tp == 1:
        return model
    spec = model.spec
    for name, n in (("heads", spec.heads), ("kv_heads", spec.kv_heads), ("ffn", spec.ffn), ("vocab", spec.vocab)):
        if n % tp:
            raise TidalError(f"TP={tp} does not divide {name}={n} of model {spec.name}")
    for layer in model.layers.values():
        a, f = layer.attention, layer.feed_forward
        a.wq, a.wk, a.wv = (ColumnParallelLinear(m, group, rank) for m in (a.wq, a.wk, a.wv))
        a.wo = RowParallelLinear(a.wo, group, rank)
        f.w1, f.w3 = ColumnParallelLinear(f.w1, group, rank), ColumnParallelLinear(f.w3, group, rank)
        f.w2 = RowParallelLinear(f.w2, group, rank)
    if model.tok_embeddings is not None:
        model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings, group, rank)
    if model.output is not None:
        model.output = ColumnParallelLinear(model.output, group, rank)
        if spec.tie_embeddings and model.tok_embeddings is not None:
            model.output.weight = model.tok_embeddings.weight
    return model


def tp_shard_dims(model: nn.Module) -> dict[str, int]:
    """Parameter name -> the dimension it is split along over TP (absent: replicated)."""
    out = {}
    for mname, m in model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
            out[f"{mname}.weight"] = m.shard_dim
    return out
