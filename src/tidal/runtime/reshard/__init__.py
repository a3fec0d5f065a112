"""Resharding engine: HSPMD annotations, hierarchical communication resolution, batched send/receive and fused
strategy switching (Hetu v2 §3-6; Hydraulis' LNK pull/push). Planning modules are pure python; `execute` and `switch`
need torch.distributed and are imported explicitly from their modules."""

from tidal.runtime.reshard.annotation import (
    DUPLICATE,
    PARTIAL,
    Annotation,
    DeviceGroup,
    DistributedStates,
    Entry,
)
from tidal.runtime.reshard.bsr import Topology
from tidal.runtime.reshard.deduce import (
    Stage,
    fully_sharded,
    linear,
    llama_layer_annotations,
    param_annotation,
    stages_of,
)
from tidal.runtime.reshard.plan import CommPlan, RankStats, TensorMove
from tidal.runtime.reshard.resolve import Resolver, classify, resolve

__all__ = [
    "DUPLICATE", "PARTIAL", "Annotation", "CommPlan", "DeviceGroup", "DistributedStates", "Entry", "RankStats",
    "Resolver", "Stage", "TensorMove", "Topology", "classify", "fully_sharded", "linear", "llama_layer_annotations",
    "param_annotation", "resolve", "stages_of",
]
