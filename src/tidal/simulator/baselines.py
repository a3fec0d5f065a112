"""Static baselines' step plans: homogeneous <TP,PP,CP> x DP search, max-length FFD packing, even dispatch.

Megatron-LM (Hydraulis §8.1 and App. G; WLB-LLM §6.1): every pipeline is the same scheme, documents are packed
first-fit-decreasing into sequences of at most the context length, and the packed sequences are dealt round-robin to
the DP replicas, one packed sequence per micro-batch. DeepSpeed (Hydraulis §8.1): Ulysses sequence parallelism x DP
with ZeRO-3 (parameters sharded over all devices, gathered for forward and again for backward), activation
checkpointing when the context does not fit otherwise; Ulysses splits heads, so attention is balanced over the SP
ranks ("heads" sharding).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from tidal.baselines.fixed import pack_fixed
from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Strategy, place
from tidal.costmodel.base import CostModel, LatencyCoeffs, Wrapper, pipeline_device
from tidal.planner.cp_adaptive import choose_for_micro_batches, cp_kernel
from tidal.planner.packing import pipeline_time

UNIT = LatencyCoeffs(0.0, 1.0, 0.0)  # token-count packing ignores latency


@dataclass(frozen=True)
class Variant(Wrapper):
    """An analytic cost model under a baseline's memory techniques. `recompute`: full activation checkpointing, the
    forward recomputed in backward (4/3 of forward + backward) and only each layer's 16-bit input kept (2 bytes per
    token per hidden unit per layer). `zero3`: 16-bit parameters and gradients sharded over all devices with the
    optimizer state (DeepSpeed ZeRO-3; the one layer gathered at a time is left to the workspace)."""

    base: CostModel
    recompute: bool = False
    zero3: bool = False

    def coeffs(self, scheme, device) -> LatencyCoeffs:
        k = self.base.coeffs(scheme, device)
        f = 4.0 / 3.0 if self.recompute else 1.0
        return LatencyCoeffs(k.a * f, k.b * f, k.c * f, k.d * f)

    def max_len(self, scheme, device) -> int:
        """MaxLen under the techniques. A fitted or pool model has no memory config: its analytic fallback's sizes
        the memory (its timings stay the fit's)."""
        base = self.base if getattr(self.base, "memory", None) is not None else getattr(self.base, "fallback", None)
        mem = getattr(base, "memory", None)
        if mem is None:
            raise TidalError("checkpointing and ZeRO-3 need a cost model with a memory config (analytic, or a fitted "
                             "model with an analytic fallback)")
        if self.recompute:
            mem = replace(mem, act_bytes_per_token_layer=2.0, act_bytes_tp_replicated=0.0)
        if self.zero3:
            mem = replace(mem, master_bytes_per_param=mem.master_bytes_per_param + mem.model_bytes_per_param,
                          app_c1_model_bytes_per_param=0.0, param_bytes_per_param=0.0, grad_bytes_per_param=0.0,
                          pull_cast_bytes_per_param=0.0)
        return replace(base, memory=mem).max_len(scheme, device)


def on_truth(planned: CostModel, truth: CostModel | None) -> CostModel:
    """The device model a plan made with `planned` executes on (decision 77): `truth` under the same baseline
    techniques (a `Variant`'s recomputation and ZeRO-3 carry over), or `planned` itself when there is no truth."""
    if truth is None:
        return planned
    if truth.model != planned.model or truth.cluster != planned.cluster:
        raise TidalError("the truth cost model is for another model or cluster than the planner's")
    if isinstance(planned, Variant):
        return replace(planned, base=truth)
    return truth


@dataclass(frozen=True)
class StaticConfig:
    strategy: Strategy
    cost_model: CostModel  # Variant(...) under checkpointing / ZeRO-3
    cp_mode: str  # per micro-batch CP sharding: per-seq | per-doc | adaptive | heads
    pack_len: int  # FFD capacity (the context length)
    label: str

    @property
    def dp(self) -> int:
        return len(self.strategy.pipelines)


def homogeneous(cost_model: CostModel, max_len: int, *, ulysses: bool = False, max_pp: int = 16,
                max_cp: int = 32) -> list[tuple[ParallelScheme, int, bool]]:
    """(scheme, DP, checkpointing) of every homogeneous config that uses all N devices and holds `max_len` tokens.
    Megatron: TP inside a node, PP dividing the layers, CP a power of two. Ulysses: TP = PP = 1, SP | heads."""
    m, cl = cost_model.model, cost_model.cluster
    n = cl.num_devices
    per_node = min(g.device.per_node for g in cl.groups)
    types = sorted({g.device for g in cl.groups}, key=lambda t: t.name)

    def fits(cm: CostModel, s: ParallelScheme) -> bool:  # on every device type: placement may use any
        return min(cm.max_len(s, t) for t in types) >= max_len

    out = []
    if ulysses:
        if getattr(cost_model, "memory", None) is None and getattr(cost_model, "fallback", None) is None:
            raise TidalError("the deepspeed baseline needs a cost model with a memory config (ZeRO-3 memory): "
                             "analytic, or a fitted/pool model with its analytic fallback")
        z3, rc = Variant(cost_model, zero3=True), Variant(cost_model, recompute=True, zero3=True)
        for sp in (1 << i for i in range(0, 12)):
            if sp > n or n % sp or m.heads % sp:
                continue
            s = ParallelScheme(1, 1, sp)
            if fits(z3, s):
                out.append((s, n // sp, False))
            elif fits(rc, s):
                out.append((s, n // sp, True))
        return out
    tps = [t for t in range(1, per_node + 1) if m.heads % t == 0 and m.kv_heads % t == 0]
    pps = [p for p in range(1, min(max_pp, m.layers) + 1) if m.layers % p == 0]
    cps = [1 << i for i in range(0, 12) if (1 << i) <= max_cp]
    for t, p, c in itertools.product(tps, pps, cps):
        s = ParallelScheme(t, p, c)
        if n % s.num_devices == 0 and fits(cost_model, s):
            out.append((s, n // s.num_devices, False))
    return out


def static_plan(lengths, cfg: StaticConfig, *, seq_ids=None, pack_len: int | None = None) -> StepPlan:
    """One step of a static baseline: FFD into sequences of <= pack_len tokens, round-robin over the DP replicas."""
    l_ = np.asarray(lengths, dtype=np.int64)
    cap = pack_len or cfg.pack_len
    if l_.size and int(l_.max()) > cap:
        raise TidalError(f"a {int(l_.max())}-token sequence exceeds the packing length {cap}")
    bins = pack_fixed(l_, UNIT, 1, cap).micro_batches if l_.size else ()
    cm = cfg.cost_model
    pipes = []
    for j, pl in enumerate(cfg.strategy.pipelines):
        mbs = tuple(tuple(int(i) for i in b) for b in bins[j::cfg.dp])
        dev = pipeline_device(cm.cluster, pl)
        k = cm.coeffs(pl.scheme, dev)
        est = pipeline_time(l_, mbs, k, pl.scheme.pp)
        sc = pl.scheme
        if sc.cp == 1:
            modes: tuple[str, ...] = ()
        elif cfg.cp_mode == "heads":
            modes = ("heads",) * len(mbs)
        else:
            modes = choose_for_micro_batches(l_, mbs, sc.cp, cp_kernel(cm.model, sc.tp, dev), cfg.cp_mode)
        pipes.append(PipelinePlan(sc.tp, sc.pp, sc.cp, pl.devices, cm.max_len(sc, dev), mbs, est, modes,
                                  sc.stage_layers(cm.model.layers)))
    ids = tuple(range(l_.size)) if seq_ids is None else tuple(int(x) for x in seq_ids)
    est = max((p.est_time for p in pipes), default=0.0)
    return StepPlan(ids, tuple(int(x) for x in l_), 0, tuple(pipes), (), est, 0.0)




def configs(cost_model: CostModel, max_len: int, *, ulysses: bool = False, cp_mode: str = "per-seq",
            pack_len: int | None = None) -> list[StaticConfig]:
    """Every feasible homogeneous config, placed."""
    out = []
    for s, dp, ckpt in homogeneous(cost_model, max_len, ulysses=ulysses):
        cm = Variant(cost_model, recompute=ckpt, zero3=ulysses) if ulysses or ckpt else cost_model
        strat = place((s,) * dp, cost_model.cluster, cost_model.model)
        name = (f"ulysses sp{s.cp} x dp{dp}" if ulysses else f"{s.short()} x dp{dp}") + (" +ckpt" if ckpt else "")
        out.append(StaticConfig(strat, cm, "heads" if ulysses else cp_mode, pack_len or max_len, name))
    if not out:
        raise TidalError(f"no homogeneous {'Ulysses' if ulysses else 'Megatron'} config of {cost_model.model.name} "
                         f"holds {max_len} tokens on {cost_model.cluster.name}")
    return out
