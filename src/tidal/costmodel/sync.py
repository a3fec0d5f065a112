"""The gradient pull/push between the fixed sharded optimizer layout and a pipeline's strategy, priced once.

Hydraulis §5.2 (Fig. 11): the optimizer state is sharded over a fixed group of devices whatever strategy a step runs;
before the step every device pulls its 16-bit share of the parameters from the owners, after its last backward it
pushes the gradients back. Layer by layer, so the pull overlaps the stage's first forward and the push its last
backward. The simulator (`simulator.engine.Simulator.simulate`) executes that; the planner (`planner.profiles`,
`select.charge_sync`) charges it in each pipeline's estimate. Both call the functions below, so a candidate is
planned at the price it is simulated at.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec


@dataclass(frozen=True)
class SyncPricing:
    """How the pull/push is priced (the simulator's SimConfig carries the same figures: `SimConfig.sync`)."""

    comm_eff: float = 0.8  # achieved / nominal link bandwidth
    param_bytes: float = 2.0  # 16-bit parameters pulled per step
    grad_bytes: float = 2.0  # 16-bit gradients pushed per step
    pulls_per_step: int = 1  # ZeRO-3 gathers parameters for forward and again for backward: 2
    overlap: bool = True  # layer-wise pull/push overlapped with the first forward / last backward
    fwd_share: float = 1.0 / 3.0  # forward share of a micro-batch's forward + backward (the planner's split)

    def __post_init__(self) -> None:
        if not 0 < self.comm_eff <= 1 or self.pulls_per_step < 1 or self.param_bytes < 0 or self.grad_bytes < 0 \
                or not 0 < self.fwd_share < 1:
            raise TidalError("sync pricing needs comm_eff in (0, 1], pulls_per_step >= 1, bytes >= 0 and "
                             "fwd_share in (0, 1)")


def stage_params(model: ModelSpec, tp: int, split) -> np.ndarray:
    """Parameters held per device of every stage of a pipeline (its TP shard): `split` layers per stage, the
    embedding on the first stage, the final norm and (untied) head on the last."""
    emb = model.vocab * model.hidden
    out = np.array([L * model.layer_params() for L in split], dtype=np.float64)
    out[0] += emb
    out[-1] += model.hidden + (0 if model.tie_embeddings else emb)
    return out / tp


def sync_bandwidth(cluster: ClusterSpec, device: int, comm_eff: float) -> float:
    """Bandwidth of a device's pull/push to the owners spread over the cluster: the share of the other devices in
    its node goes over the intra-node links, the rest over its share of the node's inter-node links, both at once,
    so the slower part bounds it (one device: intra-node only)."""
    t = cluster.device_type(device)
    n = cluster.num_devices
    if n == 1:
        return t.intra_bw * comm_eff
    node = cluster.node_of(device)
    local = sum(1 for d in range(n) if cluster.node_of(d) == node) - 1
    remote = (n - 1 - local) / (n - 1)
    per_byte = max(remote / t.inter_bw, (1 - remote) / t.intra_bw)
    return comm_eff / per_byte


def sync_seconds(params: np.ndarray, bandwidth: np.ndarray, group: int, pricing: SyncPricing
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(pull, push) seconds per stage: each device moves the (group - 1) / group share of its stage's parameters
    (gradients) that other devices own, at its `bandwidth`."""
    share = (group - 1) / group if group > 1 else 0.0
    pull = pricing.pulls_per_step * pricing.param_bytes * params * share / bandwidth
    push = pricing.grad_bytes * params * share / bandwidth
    return pull, push


def exposed(t, layers, d, overlap: bool = True):
    """Seconds a layer-wise transfer of `t` seconds over `layers` layers adds to a compute of `d` seconds it overlaps
    (the pull before a stage's first forward, the push after its last backward): layer j's transfer must be in before
    (after) layer j computes, so max(t / layers, t - (layers - 1) d / layers); without overlap, all of t. Element-wise
    on arrays."""
    if not overlap:
        return t
    return np.maximum(t / layers, t - (layers - 1) * d / layers)


def pipeline_sync(model: ModelSpec, cluster: ClusterSpec, devices, tp: int, cp: int, split, group: int,
                  pricing: SyncPricing) -> tuple[np.ndarray, np.ndarray]:
    """(pull, push) seconds per stage of one placed pipeline (`devices` as in core.strategy.Pipeline: stage-major)."""
    n = tp * cp
    params = stage_params(model, tp, split)
    bws = np.array([sync_bandwidth(cluster, devices[s * n], pricing.comm_eff) for s in range(len(split))])
    return sync_seconds(params, bws, group, pricing)


def sync_delay(pull: np.ndarray, push: np.ndarray, layers: np.ndarray, d_first: float, d_last: float,
               overlap: bool = True) -> float:
    """Seconds the pull/push adds to a pipeline whose stage micro-batch takes `d_first` (first forward) and
    `d_last` (last backward) on every stage: stage s's first forward would start s forwards in and its last backward
    end s backwards before the pipeline's, so only what its exposed transfer exceeds that by shows; the largest over
    stages, for the pull and for the push."""
    s = np.arange(len(layers), dtype=np.float64)
    pull_x = np.max(exposed(pull, layers, d_first, overlap) - s * d_first)
    push_x = np.max(exposed(push, layers, d_last, overlap) - s * d_last)
    return float(max(pull_x, 0.0) + max(push_x, 0.0))
