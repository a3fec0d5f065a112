"""Adaptive per-micro-batch choice between per-sequence and per-document CP sharding (WLB-LLM §5.3; docs/wlb.md,
"Adaptive CP sharding"): each mode's slowest CP rank under the attention kernel model, the cheaper mode wins (ties to
per-seq); and the CP kernel imbalance the planner's estimates and the simulator share (decision 77).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.cluster import DeviceType
from tidal.core.cplayout import MODES
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.kernel import KernelModel, kernel_for
from tidal.planner.bounds import prices_eq1
from tidal.planner.cp_sharding import segment_pieces
from tidal.planner.pipecost import packed_value, stage_q


@dataclass(frozen=True)
class CPChoice:
    mode: str  # "per-seq" | "per-doc"
    rank_times: dict[str, tuple[float, ...]]  # per mode: estimated attention seconds of each rank

    def time_of(self, mode: str) -> float:
        """Attention time under `mode`: its slowest rank."""
        return max(self.rank_times[mode])


def choose_cp_sharding(doc_lengths, cp: int, kernel: KernelModel) -> CPChoice:
    """Shard the packed micro-batch `doc_lengths` both ways over `cp` ranks and keep the faster under `kernel`."""
    arr = np.asarray(doc_lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise TidalError(f"choose_cp_sharding needs a non-empty 1-D list of document lengths, got shape {arr.shape}")
    times: dict[str, tuple[float, ...]] = {}
    for mode in MODES:
        # segments straight from the lengths (equal to shard_micro_batch's; no token-level arrays)
        rank, q_start, q_len, _ = segment_pieces(arr, cp, mode)
        times[mode] = tuple(kernel.rank_time(q_start[rank == r], q_len[rank == r]) for r in range(cp))
    best = "per-doc" if max(times["per-doc"]) < max(times["per-seq"]) else "per-seq"
    return CPChoice(best, times)


def choose_for_micro_batches(lengths, micro_batches: Sequence[Sequence[int]], cp: int, kernel: KernelModel,
                             policy: str = "adaptive") -> tuple[str, ...]:
    """`PipelinePlan.cp_sharding` for a packing: one mode per micro-batch (empty tuple when cp == 1).
    policy: "adaptive" (choose per micro-batch), "per-seq" or "per-doc" (fixed)."""
    if policy not in ("adaptive", *MODES):
        raise TidalError(f"unknown CP sharding policy {policy!r}; choose adaptive, per-seq or per-doc")
    if cp == 1:
        return ()
    if policy != "adaptive":
        return tuple(policy for _ in micro_batches)
    arr = np.asarray(lengths, dtype=np.int64)
    return tuple(choose_cp_sharding(arr[list(mb)], cp, kernel).mode for mb in micro_batches)


# -- CP kernel imbalance: the one charge the planner's estimates and the simulator share (decision 77) -------------


def cp_kernel(model: ModelSpec, tp: int, device: DeviceType) -> KernelModel:
    """The attention kernel of one layer on one rank of a TP-`tp` group on `device` (forward + backward, 60 % of peak
    at saturation, the device's tile and half-efficiency query length): what the planner's CP sharding choice and
    charge and the simulator's both use."""
    return kernel_for(model, tp=tp, layers=1, peak=device.peak_flops * 0.6, passes=3.0, tile=device.attn_tile,
                      q_half=device.attn_q_half)


def cp_imbalance(doc_lengths, cp: int, kernel: KernelModel, mode: str) -> float:
    """The factor on a CP micro-batch's attention term: the slowest CP rank's attention time under `mode` (kernel
    model: tile padding, efficiency by query length) over a perfect 1/CP share of the unsharded documents' time,
    at least 1. 1 for CP = 1 and for "heads" (Ulysses splits heads: balanced)."""
    if cp == 1 or mode == "heads":
        return 1.0
    arr = np.asarray(doc_lengths, dtype=np.int64)
    if arr.size == 0:
        return 1.0
    rank, qs, ql, _ = segment_pieces(arr, cp, mode if mode in MODES else "per-seq")
    worst = float(np.bincount(rank, weights=kernel.piece_times(qs, ql), minlength=cp).max())
    ideal = kernel.rank_time(np.zeros(arr.size, dtype=np.int64), arr) / cp
    return max(1.0, worst / ideal) if ideal > 0 else 1.0


def charged_pipeline_time(lengths, micro_batches: Sequence[Sequence[int]], coeffs: LatencyCoeffs, pp: int, cp: int,
                          modes: Sequence[str], kernel: KernelModel) -> float:
    """`packing.pipeline_time` ((PP - 1 + V) x the slowest micro-batch, their sum when PP = 1 unless `coeffs` carry
    Hydraulis Eq. 1) with every CP micro-batch's attention term charged `cp_imbalance` under its sharding mode, as the
    simulator charges it."""
    arr = np.asarray(lengths, dtype=np.int64)
    mbs = [(m, mb) for m, mb in enumerate(micro_batches) if len(mb)]
    if not mbs:
        return 0.0
    worst = total = 0.0
    for m, mb in mbs:
        ls = arr[list(mb)]
        f = cp_imbalance(ls, cp, kernel, modes[m] if m < len(modes) else "per-seq") if coeffs.a > 0 else 1.0
        lf = ls.astype(np.float64)
        t = coeffs.c + coeffs.a * float(np.sum(lf * lf)) * f + coeffs.b * float(lf.sum()) + coeffs.d * len(mb)
        worst = max(worst, t)
        total += t
    c = float(coeffs.c)
    return packed_value(stage_q(pp, prices_eq1(coeffs)), c, total - len(mbs) * c, worst, len(mbs))
