"""The context-parallel (CP) layout of one packed micro-batch: which tokens each CP rank holds and the attention
segments it runs (the planner builds it, planner/cp_sharding.py; the runtime reads it, runtime/cp.py). Types only;
the field meanings and the two modes are in planner/cp_sharding.py's module docstring."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("per-seq", "per-doc")


@dataclass(frozen=True, eq=False)
class RankShard:
    """One CP rank's share of a packed micro-batch; see the module docstring for each field."""

    indices: np.ndarray
    positions: np.ndarray
    doc_ids: np.ndarray
    cu_seqlens_q: np.ndarray
    k_start: np.ndarray
    k_len: np.ndarray
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
