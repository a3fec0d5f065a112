"""Imbalance metrics: WLB-LLM's max/mean micro-batch latency and Hydraulis Fig. 15b's rank latency spread."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.costmodel.base import LatencyCoeffs


def mb_times(lengths, micro_batches: Sequence[Sequence[int]], coeffs: LatencyCoeffs) -> np.ndarray:
    """Per micro-batch stage time c + sum(a l^2 + b l) (empty micro-batches are skipped)."""
    l_ = np.asarray(lengths, dtype=np.float64)
    return np.array([coeffs.mb_time(l_[list(mb)]) for mb in micro_batches if len(mb)], dtype=np.float64)


def max_over_mean(times) -> float:
    """max / mean (1.0 for no or all-zero entries): WLB-LLM's imbalance degree."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0 or t.mean() <= 0:
        return 1.0
    return float(t.max() / t.mean())


def spread(times) -> float:
    """(max - min) / max over ranks (0 for no or all-zero entries): the gap between the slowest and fastest rank."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0 or t.max() <= 0:
        return 0.0
    return float((t.max() - t.min()) / t.max())
