"""Latency T(docs, scheme) and memory MaxLen(scheme): analytic from specs, or fitted from profiles."""

from tidal.costmodel.analytic import AnalyticCostModel, Efficiency, default_cost_model
from tidal.costmodel.base import CostModel, LatencyCoeffs, pipeline_device
from tidal.costmodel.memory import MemoryConfig, max_len, stage_memory

__all__ = [
    "AnalyticCostModel", "CostModel", "Efficiency", "LatencyCoeffs", "MemoryConfig", "default_cost_model", "max_len",
    "pipeline_device", "stage_memory",
]
