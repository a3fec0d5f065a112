"""Latency T(docs, scheme) and memory MaxLen(scheme): analytic from specs, or fitted from profiles."""

from tidal.costmodel.analytic import AnalyticCostModel, Efficiency, default_cost_model
from tidal.costmodel.base import CostModel, LatencyCoeffs, pipeline_device
from tidal.costmodel.fitted import FittedCostModel, fit_rows, fitted_from_rows, read_profile
from tidal.costmodel.loader import load_cost_model
from tidal.costmodel.memory import MemoryConfig, budget_bytes, max_len, stage_memory

__all__ = [
    "AnalyticCostModel", "CostModel", "Efficiency", "FittedCostModel", "fit_rows", "fitted_from_rows",
    "load_cost_model", "read_profile", "LatencyCoeffs", "MemoryConfig", "budget_bytes", "default_cost_model", "max_len",
    "pipeline_device", "stage_memory",
]
