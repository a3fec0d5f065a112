"""Imbalance metrics (definitions in docs/wlb.md, "Metrics"). Empty or all-zero input gives the balanced value (1.0
for the ratios, 0.0 for the spread and the delay) instead of dividing by zero; a step's empty micro-batches count, with
time 0, since a pipeline slot is still spent on them."""

from __future__ import annotations

import numpy as np

from tidal.core.errors import TidalError


def _arr(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size and (not np.all(np.isfinite(a)) or a.min() < 0):
        raise TidalError("metrics need finite, non-negative values")
    return a


def max_over_mean(values) -> float:
    a = _arr(values)
    if a.size == 0 or a.sum() == 0:
        return 1.0
    return float(a.max() / a.mean())


def mb_imbalance(times) -> float:
    """max / mean micro-batch latency of one step (WLB imbalance degree)."""
    return max_over_mean(times)


def rank_spread(times) -> float:
    """(max - min) / max latency across ranks or pipelines."""
    a = _arr(times)
    if a.size == 0 or a.max() == 0:
        return 0.0
    return float((a.max() - a.min()) / a.max())


def token_delay(lengths, delays) -> float:
    """Token-weighted mean delay (steps) of documents of `lengths` delayed by `delays` steps."""
    length = _arr(lengths)
    d = _arr(delays)
    if length.shape != d.shape:
        raise TidalError(f"token_delay: {length.size} lengths but {d.size} delays")
    return float((length * d).sum() / length.sum()) if length.sum() > 0 else 0.0
