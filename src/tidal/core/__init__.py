"""Frozen specs and plans with JSON round trips. No torch, no numpy-heavy logic."""

from tidal.core.cluster import DEVICE_TYPES, ClusterSpec, DeviceType, NodeGroup, get_cluster
from tidal.core.errors import TidalError
from tidal.core.model import MODEL_PRESETS, ModelSpec, get_model
from tidal.core.plan import PipelinePlan, Plan, StepPlan
from tidal.core.scheme import ParallelScheme, format_strategy, parse_scheme, parse_strategies, parse_strategy
from tidal.core.strategy import Pipeline, Strategy, place

__all__ = [
    "DEVICE_TYPES", "MODEL_PRESETS", "ClusterSpec", "DeviceType", "ModelSpec", "NodeGroup", "ParallelScheme",
    "Pipeline", "PipelinePlan", "Plan", "StepPlan", "Strategy", "TidalError", "format_strategy", "get_cluster",
    "get_model", "parse_scheme", "parse_strategies", "parse_strategy", "place",
]
