"""Model FLOPs of a training step and the peak FLOP/s of a cluster: the two sides of MFU (model FLOPs utilisation).

Model FLOPs count the work the model needs, not what the runtime did: forward + backward = 3 x forward (no activation
recompute, no padding, no redundant per-doc CP rectangles), from ModelSpec's counts (`linear_flops_per_token`: every
GEMM of a layer; `attn_flops_per_token_pair`: QK^T and PV per causal (query, key) pair) plus the output head's
2 x vocab x hidden per token. Attention is counted per sequence as l(l+1)/2 causal pairs, so a step of long
documents is credited with its quadratic work (PaLM's 6N + 12·L·h·s formula assumes one fixed length and the full
s x s square).
"""

from __future__ import annotations

from collections.abc import Iterable

from tidal.core.cluster import ClusterSpec
from tidal.core.model import ModelSpec


def train_flops(spec: ModelSpec, seq_lengths: Iterable[int]) -> float:
    """Model FLOPs of one optimizer step over sequences of these lengths (each a causal document)."""
    lengths = [int(n) for n in seq_lengths]
    tokens = sum(lengths)
    pairs = sum(n * (n + 1) / 2 for n in lengths)
    forward = (spec.layers * (spec.linear_flops_per_token() * tokens + spec.attn_flops_per_token_pair() * pairs)
               + 2.0 * spec.vocab * spec.hidden * tokens)
    return 3.0 * forward


def peak_flops(cluster: ClusterSpec) -> float:
    """The cluster's peak FLOP/s: each device type's `peak_flops` (dense 16-bit; for `cpu` a nominal figure) times
    its count. 0 when a device type has none."""
    return float(sum(g.device.peak_flops * g.devices for g in cluster.groups))


def mfu(flops: float, seconds: float, peak: float) -> float | None:
    """FLOPs done in `seconds` over the peak; None when either is not positive."""
    if seconds <= 0 or peak <= 0:
        return None
    return flops / seconds / peak
