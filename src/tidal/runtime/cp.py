"""Context parallelism by K/V all-gather (WLB-LLM §2.1): padding-free, per-document or per-sequence sharding.

Each CP rank holds the tokens the planner's :func:`tidal.planner.cp_sharding.shard_micro_batch` gave it and runs every
token-wise op on them alone. In each attention layer the ranks all-gather K and V (one collective for both; rows padded
on the wire to the largest rank), reorder them into packed order with ``VarlenBatch.kv_index``, and attend with the
shard's per-segment key ranges, which makes per-document causal masking exact. Autograd turns the gather into a
reduce-scatter of dK/dV in backward. Gradients of the (replicated) weights are then summed over the CP group by the
runner, exactly like data parallelism.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tidal.core.cplayout import CPShard
from tidal.core.errors import TidalError
from tidal.models.attention import VarlenMeta
from tidal.models.llama import VarlenBatch
from tidal.runtime.comm import gather_rows, group_size


class KVAllGather:
    """``Attention.kv_exchange`` hook: all-gather local K/V over `group` and return them in packed order."""

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch):
        if batch.kv_index is None:
            raise TidalError("context parallelism needs a VarlenBatch with kv_index (build it with cp_rank_batch)")
        hk = k.shape[1]
        kv = gather_rows(torch.cat([k, v], dim=1), self.group, batch.kv_rows)
        kv = kv.index_select(0, batch.kv_index)  # on the model's device (the model checks the batch's)
        return kv[:, :hk], kv[:, hk:]


def apply_cp(model: nn.Module, group) -> nn.Module:
    """Install the K/V all-gather hook on every attention layer of `model` (no-op for a group of one)."""
    if group_size(group) > 1:
        hook = KVAllGather(group)
        for layer in model.layers.values():
            layer.attention.kv_exchange = hook
    return model


def cp_rank_batch(shard: CPShard, rank: int, slots=None) -> VarlenBatch:
    """The attention context of CP rank `rank` (layout order): its positions, segments, and where each packed token
    sits in the all-gathered K/V buffer. The buffer is in *group* order (ascending global rank), so layout rank r's
    rows start at ``slots[r] * rows`` (``slots`` from RankGrid.cp_slots; identity when None). Built on the host (CPU
    tensors and the segments' host lists); the runner moves it to the model's device in one copy
    (:func:`tidal.models.llama.batch_to_device`)."""
    if not 0 <= rank < shard.cp:
        raise TidalError(f"CP rank {rank} out of range for CP={shard.cp}")
    slots = tuple(range(shard.cp)) if slots is None else tuple(int(s) for s in slots)
    if sorted(slots) != list(range(shard.cp)):
        raise TidalError(f"CP slots {slots} are not a permutation of 0..{shard.cp - 1}")
    rows = max(rs.num_tokens for rs in shard.ranks)
    kv_index = np.empty(shard.total_tokens, dtype=np.int64)
    for r, rs in enumerate(shard.ranks):
        kv_index[rs.indices] = slots[r] * rows + np.arange(rs.num_tokens)
    rs = shard.ranks[rank]
    meta = VarlenMeta(
        cu_seqlens_q=torch.from_numpy(rs.cu_seqlens_q.astype(np.int64)),
        k_start=torch.from_numpy(rs.k_start.copy()),
        k_len=torch.from_numpy(rs.k_len.copy()),
        max_seqlen_q=int(rs.max_seqlen_q),
        max_seqlen_k=int(rs.max_seqlen_k),
        host=(tuple(int(x) for x in rs.cu_seqlens_q), tuple(int(x) for x in rs.k_start),
              tuple(int(x) for x in rs.k_len)),
    )
    kv = torch.from_numpy(kv_index) if shard.cp > 1 else None
    return VarlenBatch(torch.from_numpy(rs.positions.copy()), meta, kv_index=kv, kv_rows=rows)
