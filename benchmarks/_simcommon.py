"""Shared helpers of the simulate_* benchmarks: a workload from the CLI's pieces and grid summaries."""

from __future__ import annotations

import numpy as np

from tidal.cli.plan import cost_model_from
from tidal.core import get_cluster, get_model
from tidal.costmodel import AnalyticCostModel
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator.systems import Workload

PROPOSAL_SAMPLE = 20000


def workload(model: str, cluster: str, data: str, max_len: int, tokens: int, steps: int, seed: int = 0, *,
             cost_model: str | None = None, truth: str | None = None) -> Workload:
    """`cost_model`, `truth`: as `tidal simulate --cost-model / --truth` take them (None: analytic, as planned)."""
    m, cl = get_model(model), get_cluster(cluster)
    cm = AnalyticCostModel(m, cl) if cost_model is None else cost_model_from(cost_model, m, cl)
    tr = None if truth is None else cost_model_from(truth, m, cl)
    src = length_source(data, seed)
    sample = src.lengths(0, PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE))
    return Workload(cm, max_len, tokens, steps, seed,
                    lambda: TokenBudgetSampler(length_source(data, seed), tokens, max_len, seed=seed), sample, tr)


def summary(values) -> str:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return "-"
    return (f"median {np.median(v):.3f}, p90 {np.percentile(v, 90):.3f}, worst {v.min():.3f}, best {v.max():.3f} "
            f"(n={v.size})")
