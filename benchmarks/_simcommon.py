"""Shared helpers of the simulate_* benchmarks: a workload from the CLI's pieces and grid summaries."""

from __future__ import annotations

import numpy as np

from tidal.core import get_cluster, get_model
from tidal.costmodel import AnalyticCostModel
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator.systems import Workload

PROPOSAL_SAMPLE = 20000


def workload(model: str, cluster: str, data: str, max_len: int, tokens: int, steps: int, seed: int = 0) -> Workload:
    cm = AnalyticCostModel(get_model(model), get_cluster(cluster))
    src = length_source(data, seed)
    sample = src.lengths(0, PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE))
    return Workload(cm, max_len, tokens, steps, seed,
                    lambda: TokenBudgetSampler(length_source(data, seed), tokens, max_len, seed=seed), sample)


def summary(values) -> str:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return "-"
    return (f"median {np.median(v):.3f}, p90 {np.percentile(v, 90):.3f}, worst {v.min():.3f}, best {v.max():.3f} "
            f"(n={v.size})")
