"""Token corpora (real ones: readers, tokenizers, a cached memory-mapped index), exactly-once accounting, length
sources, token-budget sampling, long-document policy, resumable state (docs/data.md)."""

from tidal.data.accounting import EpochLedger
from tidal.data.corpus import RandomTokenCorpus, StdlibCorpus, TokenCorpus, corpus_from_spec
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
    "EpochLedger", "LONG_DOC_POLICIES", "SYNTHETIC", "LengthSource", "LongDocStats", "RandomTokenCorpus",
    "SamplerState", "StdlibCorpus", "Step", "TokenBudgetSampler", "TokenCorpus", "corpus_from_spec", "length_source",
    "load_lengths", "sample_steps", "split_sizes",
]
