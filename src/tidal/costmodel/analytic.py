"""Analytic latency model from ModelSpec, DeviceType and configurable efficiencies (no profiling needed).

Per stage, with L_s layers, TP degree t, CP degree c, peak 16-bit FLOP/s F:
  attention  a = L_s * 3 * (4h) / 2 / (t c F e_attn(h/t))    causal: l(l+1)/2 query-key pairs, fwd+bwd = 3x fwd
  linear     b = L_s * 3 * 2 P_layer / (t c F e_gemm(2 P_layer / t))   (+ LM head on the last stage)
             + TP: 8 sequence-parallel collectives/layer of 2h bytes/token * (t-1)/t / (c * ring bw)
             + CP: ring attention, cp_ring_passes * 4 kv_dim/t bytes/token * (c-1)/c / ring bw
             + PP: activation + gradient p2p of 2h/(t c) bytes/token each (per-GPU share across nodes)
  constant   c = L_s * (launch_per_layer + collectives * collective_latency + tp_const [t > 1] + cp_const * (c-1))
Efficiencies saturate with the per-GPU GEMM size and attention width (`Efficiency.gemm_eff`, `attn_eff`); the
defaults are calibrated on Hydraulis' A800 strategy pools (decision 76, docs/costmodel.md), `EFFICIENCY_V1` /
`analytic_v1` keep the model before. Communication is charged serially (no overlap) and then scaled by
`comm_overlap` (0 = fully exposed). The stage coefficients are combined by an elementwise max, an upper envelope of
every stage's time. CP's kernel imbalance is charged per micro-batch outside the coefficients (planner.cp_adaptive).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tidal.core.cluster import ClusterSpec, DeviceType
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.memory import MemoryConfig, max_len


@dataclass(frozen=True)
class Efficiency:
    """Achieved/peak ratios and constants of the analytic model. The defaults are calibrated on Hydraulis' A800
    strategy pools (docs/costmodel.md, decision 76; `benchmarks/costmodel_profiles.py` refits and reports them);
    `EFFICIENCY_V1` keeps the model before that (flat GEMM efficiency, microsecond constants)."""

    # Calibrated on Hydraulis' 7b and 13b A800 strategy pools (lengths 512-32K, every profiled <TP, PP>; 32b and
    # 7b_A100 held out): benchmarks/costmodel_profiles.py --refit prints the fit; docs/costmodel.md the errors.
    gemm: float = 0.729  # achieved / peak FLOPs of large GEMMs (the saturation value of gemm_eff)
    attn: float = 0.750  # achieved / peak FLOPs of the varlen attention kernel (the saturation value of attn_eff)
    comm: float = 0.779  # achieved / nominal link bandwidth
    comm_overlap: float = 0.0  # fraction of communication hidden behind compute
    launch_per_layer: float = 1.49e-3  # s per layer per micro-batch (fwd+bwd): launches, norms, the pool's intercept
    collective_latency: float = 0.0  # s per collective call (calibrated: inside tp_const_per_layer)
    # GEMM efficiency by size: gemm * x / (x + gemm_half_flops), x = forward GEMM FLOPs per token of one layer on one
    # GPU (linear_flops_per_token / TP): TP shrinks every GEMM's N or K dimension. 0: flat (v1).
    gemm_half_flops: float = 1.42e7
    # attention efficiency by per-GPU width: attn * y / (y + attn_half_width), y = hidden / TP. 0: flat (v1).
    attn_half_width: float = 212.0
    tp_const_per_layer: float = 3.2e-4  # s per layer per micro-batch added when TP > 1 (its collectives' fixed costs)
    # s per layer per micro-batch per extra CP rank: 3 ring steps (1 forward, 2 backward) at the fitted cost of one
    # TP collective (tp_const_per_layer / 8 collectives); not measured (no CP profile is published)
    cp_const_per_layer: float = 1.2e-4
    cp_ring_passes: float = 3.0  # K/V volumes moved per token per layer over the CP ring (fwd K,V + bwd K,V, dK,dV)
    # Memory-bound kernels (norms, RoPE, SwiGLU's gates, residual adds, casts, the loss), charged at the device's
    # `hbm_bw`, in bytes per token per hidden unit per layer and per token per vocabulary entry (last stage), split
    # over t * c ranks. 0 in the pools' calibration: a pool cannot tell them from the GEMMs (both scale with tokens on
    # one device type), so its fitted GEMM efficiency holds them. `EFFICIENCY_EAGER` measures them (decision 116).
    elementwise_bytes: float = 0.0
    vocab_bytes: float = 0.0
    doc_per_layer: float = 0.0  # s per document per layer (per-document attention calls and their bookkeeping)
    # x the device's inter-node bandwidth (its share of the node's links); v1 charged the whole node's to each GPU: 8
    inter_bw_scale: float = 1.0

    def __post_init__(self) -> None:
        for f in ("gemm", "attn", "comm"):
            if not 0 < getattr(self, f) <= 1:
                raise TidalError(f"efficiency {f} must be in (0, 1], got {getattr(self, f)}")
        if not 0 <= self.comm_overlap < 1:
            raise TidalError(f"comm_overlap must be in [0, 1), got {self.comm_overlap}")
        if not self.inter_bw_scale > 0:
            raise TidalError(f"inter_bw_scale must be > 0, got {self.inter_bw_scale}")
        for f in ("launch_per_layer", "collective_latency", "gemm_half_flops", "attn_half_width",
                  "tp_const_per_layer", "cp_const_per_layer", "cp_ring_passes", "elementwise_bytes", "vocab_bytes",
                  "doc_per_layer"):
            if not getattr(self, f) >= 0:
                raise TidalError(f"efficiency {f} must be >= 0, got {getattr(self, f)}")

    def gemm_eff(self, flops_per_token: float) -> float:
        return self.gemm * flops_per_token / (flops_per_token + self.gemm_half_flops)

    def attn_eff(self, width: float) -> float:
        return self.attn * width / (width + self.attn_half_width)


# the model before decision 76 (`--cost-model analytic-v1`): flat efficiencies, microsecond constants
EFFICIENCY_V1 = Efficiency(gemm=0.55, attn=0.45, comm=0.8, launch_per_layer=60e-6, collective_latency=15e-6,
                           gemm_half_flops=0.0, attn_half_width=0.0, tp_const_per_layer=0.0, cp_const_per_layer=0.0,
                           cp_ring_passes=2.0, inter_bw_scale=8.0)


# Tidal's own eager runtime on Hopper (decision 116): fitted by benchmarks/hopper_fit.py on one H200's measurements
# (GEMMs and flex attention alone at llama2-7b's TP 1-8 shards, `tidal profile` rows of llama2-7b's layer shape;
# llama3.2-1b held out). Communication constants stay the pools' (nothing was measured across GPUs).
EFFICIENCY_EAGER = Efficiency(gemm=0.714, gemm_half_flops=1.44e7, attn=0.221, attn_half_width=434.0,
                              elementwise_bytes=796.0, vocab_bytes=28.0, launch_per_layer=3.30e-3,
                              doc_per_layer=1.59e-5)


# Tidal's eager runtime on Hopper with attn_backend "mixed" (decision 119; auto on CUDA since decision 140):
# each micro-batch runs sdpa or flex by core.attnrule.H200_RULE, a minimum of two prices that the per-document
# form T = c + sum(a l^2 + b l + d) cannot hold. Its additive envelope: attention at sdpa's rate (flat across
# widths, as sdpa's TP 1-8 kernel rows are at 16-32K tokens; the rule runs sdpa wherever the l^2 term is large),
# the per-micro-batch and per-document constants of flex (the rule runs flex wherever sdpa's per-document costs
# would be large). `attn` fitted on llama2-7b x4's measured time of the rule's pick per micro-batch, every other
# term EFFICIENCY_EAGER's (benchmarks/attn_rule_fit.py; llama3.2-1b held out).
EFFICIENCY_EAGER_MIXED = replace(EFFICIENCY_EAGER, attn=0.556, attn_half_width=0.0)


def _link_bw(device: DeviceType, span: int, inter_scale: float = 1.0, ring: bool = False) -> float:
    """Per-device bandwidth of a group of `span` consecutive devices: intra-node if it fits in a node. Across nodes, a
    ring collective (TP, CP) runs one ring per NIC, each crossing the node boundary once, so its per-device bandwidth
    is the node's whole inter-node bandwidth (per-GPU share x per_node; Hydraulis' TP16 profile implies ~160 GB/s per
    GPU); point-to-point traffic that every device sends at once (PP) gets the per-GPU share (x inter_scale, v1: 8)."""
    if span <= device.per_node:
        return device.intra_bw
    if ring:
        return min(device.intra_bw, device.inter_bw * device.per_node)
    return device.inter_bw * inter_scale


@dataclass(frozen=True)
class AnalyticCostModel:
    model: ModelSpec
    cluster: ClusterSpec
    eff: Efficiency = field(default_factory=Efficiency)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    uncalibrated: Efficiency = EFFICIENCY_V1  # on devices with calibrated=False (CPU ranks): nominal v1 figures

    def eff_for(self, device: DeviceType) -> Efficiency:
        return self.eff if device.calibrated else self.uncalibrated

    def coeffs(self, scheme: ParallelScheme, device: DeviceType) -> LatencyCoeffs:
        m, e = self.model, self.eff_for(device)
        t, c, p = scheme.tp, scheme.cp, scheme.pp
        F = device.peak_flops
        h = m.hidden
        exposed = 1.0 - e.comm_overlap
        attn_pair = 3 * m.attn_flops_per_token_pair() / 2 / (t * c * F * e.attn_eff(h / t))  # per layer, per l^2
        if c > 1 and device.attn_cp_rect:  # the busiest rank's chunks {r, 2c-1-r} cost (2c+1) (l/2c)^2 rectangles
            attn_pair *= (2 * c + 1) / (2 * c)
        gemm_tok = 3 * m.linear_flops_per_token() / (t * c * F * e.gemm_eff(m.linear_flops_per_token() / t))
        tp_tok = 8 * 2 * h * (t - 1) / t / c / (_link_bw(device, t, ring=True) * e.comm) if t > 1 else 0.0
        cp_bw = _link_bw(device, t * c, ring=True) * e.comm
        cp_tok = e.cp_ring_passes * 2 * 2 * m.kv_dim / t * (c - 1) / c / cp_bw if c > 1 else 0.0
        pp_tok = 2 * 2 * h / (t * c) / (_link_bw(device, t * c * p, e.inter_bw_scale) * e.comm) if p > 1 else 0.0
        head_tok = 3 * 2 * h * m.vocab / (t * c * F * e.gemm_eff(2 * h * m.vocab / t))
        elem_tok = e.elementwise_bytes * h / (t * c * device.hbm_bw)
        head_tok += e.vocab_bytes * m.vocab / (t * c * device.hbm_bw)
        n_coll = (8 if t > 1 else 0) + (4 if c > 1 else 0)
        best = LatencyCoeffs(0.0, 0.0, 0.0, 0.0)
        stages = scheme.stage_layers(m.layers)
        for s, L in enumerate(stages):
            a = L * attn_pair
            b = L * (gemm_tok + attn_pair + elem_tok + exposed * (tp_tok + cp_tok)) + exposed * pp_tok
            if s == len(stages) - 1:
                b += head_tok
            const = L * (e.launch_per_layer + n_coll * e.collective_latency
                         + (e.tp_const_per_layer if t > 1 else 0.0) + e.cp_const_per_layer * (c - 1))
            best = LatencyCoeffs(max(best.a, a), max(best.b, b), max(best.c, const), max(best.d, L * e.doc_per_layer))
        return best

    def max_len(self, scheme: ParallelScheme, device: DeviceType) -> int:
        return max_len(self.model, scheme, device, self.cluster.num_devices, self.memory)


def default_cost_model(model: ModelSpec, cluster: ClusterSpec) -> AnalyticCostModel:
    return AnalyticCostModel(model, cluster)


def analytic_v1(model: ModelSpec, cluster: ClusterSpec) -> AnalyticCostModel:
    """The analytic model before decision 76 (`--cost-model analytic-v1`): flat 0.55 GEMM efficiency, microsecond
    constants, 34 B of activations per token per layer per hidden unit."""
    from tidal.costmodel.memory import MEMORY_V1

    return AnalyticCostModel(model, cluster, EFFICIENCY_V1, MEMORY_V1)


def named_efficiency(name: str) -> Efficiency | None:
    """The efficiencies a cost-model name stands for: '' or 'analytic' (calibrated on Hydraulis' pools), or
    'analytic-eager' (`EFFICIENCY_EAGER`: Tidal's own eager runtime with flex attention, fitted on one H200;
    decision 116), 'analytic-eager-mixed' (`EFFICIENCY_EAGER_MIXED`: the same runtime choosing sdpa or flex per
    micro-batch; decision 119); None for anything else (a file: `costmodel.loader.load_cost_model`)."""
    key = name.strip().lower()
    if key in ("", "analytic"):
        return Efficiency()
    return {"analytic-eager": EFFICIENCY_EAGER, "analytic-eager-mixed": EFFICIENCY_EAGER_MIXED}.get(key)
