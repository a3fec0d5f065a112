"""Which attention kernel one micro-batch should run: per-document SDPA or one FlexAttention call (decision 119).

Without flash-attn, a GPU has two varlen kernels (models/attention.py). ``sdpa`` calls cuDNN's flash kernel once per
document: fast per FLOP (0.49 of an H200's peak at 16-32K tokens against flex's 0.25), but every document costs its
own launches, slices and a concatenation. ``flex`` runs the whole packed micro-batch in one compiled kernel. So
sdpa wins on long documents and flex on many short ones. Per layer (forward + backward), their difference is modelled
as

    t_sdpa - t_flex = seg_cost * S - flex_const - flex_work * W

with S the micro-batch's segments (documents, or CP pieces) and W = query heads x head dim x causal (query, key)
pairs, the attention work on this rank. :meth:`AttnBackendRule.pick` says "flex" where that is positive, else
"sdpa". The constants are a value (:data:`H200_RULE`, fitted by ``benchmarks/attn_rule_fit.py``), passed to the
model that uses them; torch-free so that the cost model can read the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tidal.core.errors import TidalError


def causal_pairs(q_len: int, k_len: int) -> int:
    """(query, key) pairs of one segment with bottom-right causal alignment: query i sees k_len - q_len + i + 1 keys."""
    return q_len * (k_len - q_len) + q_len * (q_len + 1) // 2


@dataclass(frozen=True)
class AttnBackendRule:
    """The fitted per-micro-batch choice between ``sdpa`` and ``flex`` (module docstring); seconds per layer,
    forward + backward."""

    seg_cost: float  # s per segment that per-document sdpa pays beyond one flex call
    flex_const: float  # s per micro-batch that one flex call pays beyond sdpa (its launch, the block mask's reads)
    flex_work: float  # s per unit of W (query heads x head dim x causal pair) flex pays beyond sdpa's kernel
    source: str = ""  # where the constants come from

    def __post_init__(self) -> None:
        for f in ("seg_cost", "flex_const", "flex_work"):
            x = getattr(self, f)
            if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
                raise TidalError(f"attention backend rule: {f} must be a finite number >= 0, got {x!r}")

    def margin(self, q_lens, k_lens, heads: int, head_dim: int) -> float:
        """Predicted t_sdpa - t_flex (s per layer) for segments of `q_lens` queries over `k_lens` keys each, on
        `heads` query heads of `head_dim`."""
        q_lens, k_lens = tuple(q_lens), tuple(k_lens)
        if len(q_lens) != len(k_lens):
            raise TidalError(f"attention backend rule: {len(q_lens)} query lengths but {len(k_lens)} key lengths")
        for n in (heads, head_dim):
            if not (isinstance(n, int) and n >= 1):
                raise TidalError(f"attention backend rule: heads and head dim must be ints >= 1, got {heads}, "
                                 f"{head_dim}")
        work = 0
        for lq, lk in zip(q_lens, k_lens):
            if not (isinstance(lq, int) and isinstance(lk, int) and 0 <= lq <= lk):
                raise TidalError(f"attention backend rule: a segment needs 0 <= queries <= keys (ints), got "
                                 f"{lq!r} queries over {lk!r} keys")
            work += causal_pairs(lq, lk)
        segments = sum(1 for lq in q_lens if lq)
        return self.seg_cost * segments - self.flex_const - self.flex_work * heads * head_dim * work

    def pick(self, q_lens, k_lens, heads: int, head_dim: int) -> str:
        """'flex' where one FlexAttention call is predicted faster than per-document sdpa, else 'sdpa' (ties: sdpa,
        the faster kernel per FLOP)."""
        return "flex" if self.margin(q_lens, k_lens, heads, head_dim) > 0 else "sdpa"

    def pick_lengths(self, lengths, heads: int, head_dim: int) -> str:
        """:meth:`pick` for whole causal documents of `lengths` (no CP)."""
        lengths = tuple(lengths)
        return self.pick(lengths, lengths, heads, head_dim)


# Fitted on one H200 (PyTorch 2.11, bf16, no flash-attn; decision 116's `tidal profile` rows): llama2-7b x 4 layers,
# sdpa against the mean of two flex runs, 12 micro-batches of 1K-16K tokens (non-negative least squares on
# t_sdpa - t_flex per layer). llama3.2-1b's 16 rows held out. `python benchmarks/attn_rule_fit.py` refits and reports.
H200_RULE = AttnBackendRule(seg_cost=2.82e-4, flex_const=1.89e-3, flex_work=3.55e-14,
                            source="H200 bf16, torch 2.11: llama2-7b x4 sdpa vs flex tidal-profile rows "
                                   "(benchmarks/attn_rule_fit.py, decision 119)")
