"""Latency coefficients and the CostModel interface every implementation (analytic, fitted) provides.

T(docs, P) for one micro-batch on one pipeline stage (forward + backward) is

    T = c + sum_i (a * l_i^2 + b * l_i + d)

the Hydraulis App. C.2 form with the constant split in two: c once per micro-batch (kernel launches, collective
latency: a packed varlen kernel launches once for the whole micro-batch) and d once per document (kernels that run
per document, e.g. CPU SDPA; 0 in the analytic model and for flash-attn varlen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tidal.core.cluster import ClusterSpec, DeviceType
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Pipeline


@dataclass(frozen=True)
class LatencyCoeffs:
    a: float  # seconds per token^2 (attention)
    b: float  # seconds per token (GEMMs, elementwise, TP/CP/PP communication)
    c: float  # seconds per micro-batch
    d: float = 0.0  # seconds per document

    def doc_cost(self, lengths: np.ndarray | float) -> np.ndarray | float:
        """Per-document share a*l^2 + b*l + d (without the micro-batch constant c)."""
        l_ = np.asarray(lengths, dtype=np.float64)
        return self.a * l_ * l_ + self.b * l_ + self.d

    def mb_time(self, lengths) -> float:
        """Time of one micro-batch holding documents `lengths` (0 for an empty micro-batch)."""
        l_ = np.asarray(lengths, dtype=np.float64)
        if l_.size == 0:
            return 0.0
        return float(self.c + np.sum(self.a * l_ * l_ + self.b * l_ + self.d))

    def util_len(self, threshold: float = 0.85) -> float:
        """Tokens a micro-batch needs before the constant costs < (1 - threshold) of its linear work (Hydraulis App. D
        UtilLen), used to bound how many micro-batches are worth enumerating."""
        if self.b <= 0:
            return 1.0
        return max(1.0, threshold * self.c / ((1 - threshold) * self.b))


class CostModel(Protocol):
    """What the planner needs from a cost model. Implementations must be pure and deterministic."""

    model: ModelSpec
    cluster: ClusterSpec

    def coeffs(self, scheme: ParallelScheme, device: DeviceType) -> LatencyCoeffs:
        """Slowest-stage latency coefficients of `scheme` on devices of type `device`."""
        ...

    def max_len(self, scheme: ParallelScheme, device: DeviceType) -> int:
        """Largest micro-batch token count that fits in memory on every stage (0: the scheme cannot run at all)."""
        ...


class Wrapper:
    """A cost model that wraps another (``self.base``) and changes some of its prices: the model and the cluster are
    the wrapped model's (costmodel.recompute.RecomputeCostModel, simulator.baselines.Variant)."""

    base: CostModel

    @property
    def model(self):
        return self.base.model

    @property
    def cluster(self):
        return self.base.cluster


def pipeline_device(cluster: ClusterSpec, pipeline: Pipeline) -> DeviceType:
    """The device type that bounds a pipeline spanning several types: the least compute, then the least memory.
    A mixed pipeline runs at its slowest stage; non-uniform layer splits that compensate are left to layer_split."""
    types = {cluster.device_type(d) for d in pipeline.devices}
    return min(types, key=lambda t: (t.peak_flops, t.memory_bytes, t.name))
