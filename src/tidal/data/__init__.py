"""Length sources, token-budget step sampling, long-document policy and resumable sampler state (docs/data.md)."""

from tidal.data.sampler import (
    LONG_DOC_POLICIES,
    LongDocStats,
    SamplerState,
    Step,
    TokenBudgetSampler,
    sample_steps,
    split_sizes,
)
from tidal.data.sources import SYNTHETIC, LengthSource, length_source, load_lengths

__all__ = [
    "LONG_DOC_POLICIES", "SYNTHETIC", "LengthSource", "LongDocStats", "SamplerState", "Step", "TokenBudgetSampler",
    "length_source", "load_lengths", "sample_steps", "split_sizes",
]
