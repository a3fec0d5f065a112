"""Analytic latency model from ModelSpec, DeviceType and configurable efficiencies (no profiling needed).

Per stage, with L_s layers, TP degree t, CP degree c, peak 16-bit FLOP/s F:
  attention  a = L_s * 3 * (4h) / 2 / (t c F e_attn)          causal: l(l+1)/2 query-key pairs, fwd+bwd = 3x fwd
  linear     b = L_s * 3 * 2 P_layer / (t c F e_gemm)        (+ LM head on the last stage)
             + TP: 8 sequence-parallel collectives/layer of 2h bytes/token * (t-1)/t / (c * bw)
             + CP: K,V all-gather fwd + reduce-scatter bwd: 2 * 2 * 2 kv_dim/t bytes/token * (c-1)/c / bw
             + PP: activation + gradient p2p of 2h/(t c) bytes/token each
  constant   c = L_s * (launch_per_layer + collective latency per layer)
Communication is charged serially (no overlap) and then scaled by `comm_overlap` (0 = fully exposed).
The stage coefficients are combined by an elementwise max, an upper envelope of every stage's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidal.core.cluster import ClusterSpec, DeviceType
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.memory import MemoryConfig, max_len


@dataclass(frozen=True)
class Efficiency:
    gemm: float = 0.55  # achieved / peak FLOPs of large GEMMs
    attn: float = 0.45  # achieved / peak FLOPs of the varlen attention kernel
    comm: float = 0.8  # achieved / nominal link bandwidth
    comm_overlap: float = 0.0  # fraction of communication hidden behind compute
    launch_per_layer: float = 60e-6  # s of kernel launches per layer per micro-batch (fwd+bwd)
    collective_latency: float = 15e-6  # s per collective call

    def __post_init__(self) -> None:
        for f in ("gemm", "attn", "comm"):
            if not 0 < getattr(self, f) <= 1:
                raise TidalError(f"efficiency {f} must be in (0, 1], got {getattr(self, f)}")
        if not 0 <= self.comm_overlap < 1:
            raise TidalError(f"comm_overlap must be in [0, 1), got {self.comm_overlap}")


def _link_bw(device: DeviceType, span: int) -> float:
    """Bandwidth of a group of `span` consecutive devices: intra-node if it fits in a node."""
    return device.intra_bw if span <= device.per_node else device.inter_bw


@dataclass(frozen=True)
class AnalyticCostModel:
    model: ModelSpec
    cluster: ClusterSpec
    eff: Efficiency = field(default_factory=Efficiency)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    def coeffs(self, scheme: ParallelScheme, device: DeviceType) -> LatencyCoeffs:
        m, e = self.model, self.eff
        t, c, p = scheme.tp, scheme.cp, scheme.pp
        F = device.peak_flops
        h = m.hidden
        exposed = 1.0 - e.comm_overlap
        attn_pair = 3 * m.attn_flops_per_token_pair() / 2 / (t * c * F * e.attn)  # per layer, per l^2
        if c > 1 and device.attn_cp_rect:  # the busiest rank's chunks {r, 2c-1-r} cost (2c+1) (l/2c)^2 rectangles
            attn_pair *= (2 * c + 1) / (2 * c)
        gemm_tok = 3 * m.linear_flops_per_token() / (t * c * F * e.gemm)
        tp_tok = 8 * 2 * h * (t - 1) / t / c / (_link_bw(device, t) * e.comm) if t > 1 else 0.0
        cp_tok = 2 * 2 * 2 * m.kv_dim / t * (c - 1) / c / (_link_bw(device, t * c) * e.comm) if c > 1 else 0.0
        pp_tok = 2 * 2 * h / (t * c) / (_link_bw(device, t * c * p) * e.comm) if p > 1 else 0.0
        head_tok = 3 * 2 * h * m.vocab / (t * c * F * e.gemm)
        n_coll = (8 if t > 1 else 0) + (4 if c > 1 else 0)
        best = LatencyCoeffs(0.0, 0.0, 0.0)
        stages = scheme.stage_layers(m.layers)
        for s, L in enumerate(stages):
            a = L * attn_pair
            b = L * (gemm_tok + attn_pair + exposed * (tp_tok + cp_tok)) + exposed * pp_tok
            if s == len(stages) - 1:
                b += head_tok
            const = L * (e.launch_per_layer + n_coll * e.collective_latency)
            best = LatencyCoeffs(max(best.a, a), max(best.b, b), max(best.c, const))
        return best

    def max_len(self, scheme: ParallelScheme, device: DeviceType) -> int:
        return max_len(self.model, scheme, device, self.cluster.num_devices, self.memory)


def default_cost_model(model: ModelSpec, cluster: ClusterSpec) -> AnalyticCostModel:
    return AnalyticCostModel(model, cluster)
