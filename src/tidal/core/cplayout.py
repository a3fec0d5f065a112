"""The context-parallel (CP) layout of one packed micro-batch: which tokens each CP rank holds and the attention
segments it runs (the planner builds it, planner/cp_sharding.py; the runtime reads it, runtime/cp.py). Types only;
the two modes are in docs/runtime.md, "CP sharding"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("per-seq", "per-doc")


@dataclass(frozen=True, eq=False)
class RankShard:
    """One CP rank's share of a packed micro-batch. A segment's Lq queries i = 0 .. Lq - 1 see keys k_start ..
    k_start + k_len - Lq + i (flash-attn varlen's bottom-right causal alignment): the keys of their own document at
    positions <= their own."""

    indices: np.ndarray  # int64 [n_r]: packed indices of the rank's tokens, ascending
    positions: np.ndarray  # int64 [n_r]: each token's position within its own document (RoPE resets per document)
    doc_ids: np.ndarray  # int64 [n_r]: which document each token belongs to
    cu_seqlens_q: np.ndarray  # int32 [s_r + 1]: local query segments (maximal packed-consecutive runs in one document)
    k_start: np.ndarray  # int64 [s_r]: first key of each segment's document in the packed (gathered) K/V
    k_len: np.ndarray  # int64 [s_r]: keys visible to the segment's last query (its end position + 1)
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def num_tokens(self) -> int:
        return int(self.indices.size)


@dataclass(frozen=True, eq=False)
class CPShard:
    mode: str
    cp: int
    lengths: tuple[int, ...]
    ranks: tuple[RankShard, ...]

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    def owner(self) -> np.ndarray:
        """int64 [T]: the rank that holds each packed token."""
        out = np.empty(self.total_tokens, dtype=np.int64)
        for r, rs in enumerate(self.ranks):
            out[rs.indices] = r
        return out
