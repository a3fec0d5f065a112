"""Imbalance metrics (definitions in docs/wlb.md).

- `mb_imbalance(times)`: WLB-LLM's imbalance degree, max / mean micro-batch latency = Max_Latency * N / Total_Latency
  (WLB §6.4, Table 2; §3.3 uses the same ratio on attention work). 1.0 is perfect balance. Empty micro-batches count
  (with time 0) when they are part of the step, because a pipeline slot is still spent on them.
- `rank_spread(times)`: (max - min) / max over ranks (or pipelines), the relative idle time of the least-loaded rank
  while it waits for the slowest one; the quantity Hydraulis Fig. 15b visualises as per-rank latency differences.
  0 is perfect balance, 1 means some rank had no work.
- `max_over_mean(values)`: max / mean of any per-rank quantity (e.g. attention FLOPs across CP ranks).
- `token_delay(lengths, delays)`: token-weighted mean delay in steps (WLB §6.4 reports 0.5 iterations per token).
All return 1.0 / 0.0 / 0.0 for empty or all-zero input instead of dividing by zero.
"""

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
