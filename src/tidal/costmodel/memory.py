"""Memory model: MaxLen(P), the Hydraulis App. C.1 linear model under optimization-propagation disaggregation.

Per device of the worst stage of scheme P = <t, p, c> in a job of N devices:
  states       = 12 B/param * all_params / N            fp32 master + Adam m, v: fully sharded over all N devices
               + 4 B/param * stage_params / t           16-bit parameters + gradients of this TP x PP shard
  activations  = act_bytes_per_token_layer * h * L_s * p * l / (t c)
                 every layer of the stage keeps activations for up to p in-flight micro-batches under 1F1B
                 (L_s * p >= layers, Hydraulis' "accumulated PP times" peak)
               + last stage: fp32 logits and their gradient, 8 * vocab / t bytes per local token
  budget       = memory * (1 - margin_frac) - min(workspace_bytes, workspace_max_frac * memory)
                 (the fixed workspace is capped so a small device, e.g. a 2 GiB CPU rank, keeps a budget)
MaxLen(P) = floor((budget - states) / per_token), 0 when even the states do not fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from tidal.core.cluster import DeviceType
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme


@dataclass(frozen=True)
class MemoryConfig:
    # 34 bytes per token per hidden unit per layer: Korthikanti et al. 2022 with sequence parallelism and a
    # memory-efficient attention kernel (no l^2 score matrix), 16-bit activations.
    act_bytes_per_token_layer: float = 34.0
    master_bytes_per_param: float = 12.0
    model_bytes_per_param: float = 4.0
    margin_frac: float = 0.10
    workspace_bytes: float = 2e9
    workspace_max_frac: float = 0.10

    def __post_init__(self) -> None:
        if not 0 <= self.margin_frac < 1:
            raise TidalError(f"memory margin_frac must be in [0, 1), got {self.margin_frac}")


def stage_memory(model: ModelSpec, scheme: ParallelScheme, n_devices: int, tokens: float,
                 cfg: MemoryConfig) -> list[float]:
    """Peak bytes per device of every stage for a micro-batch of `tokens` tokens."""
    t, c, p = scheme.tp, scheme.cp, scheme.pp
    master = cfg.master_bytes_per_param * model.num_params() / n_devices
    emb = model.vocab * model.hidden
    stages = scheme.stage_layers(model.layers)
    out = []
    for s, L in enumerate(stages):
        params = L * model.layer_params()
        if s == 0:
            params += emb
        if s == len(stages) - 1:
            params += model.hidden + (0 if model.tie_embeddings else emb)
        act_per_tok = cfg.act_bytes_per_token_layer * model.hidden * L * p / (t * c)
        if s == len(stages) - 1:
            act_per_tok += 8.0 * model.vocab / (t * c)
        out.append(master + cfg.model_bytes_per_param * params / t + act_per_tok * tokens)
    return out


def budget_bytes(device: DeviceType, cfg: MemoryConfig) -> float:
    """Bytes a device offers to states and activations after the safety margin and workspace."""
    mem = device.memory_bytes
    return mem * (1 - cfg.margin_frac) - min(cfg.workspace_bytes, cfg.workspace_max_frac * mem)


def max_len(model: ModelSpec, scheme: ParallelScheme, device: DeviceType, n_devices: int, cfg: MemoryConfig) -> int:
    budget = budget_bytes(device, cfg)
    fixed = stage_memory(model, scheme, n_devices, 0.0, cfg)
    slope = [m1 - m0 for m0, m1 in zip(fixed, stage_memory(model, scheme, n_devices, 1.0, cfg))]
    best = min((budget - f) / s for f, s in zip(fixed, slope))
    return max(0, int(best))


@dataclass(frozen=True)
class ActivationFit:
    """Measured activation bytes of one micro-batch on the worst rank: m0 + m1 * sum(l) + m2 * sum(l^2)."""

    m0: float
    m1: float
    m2: float
    rows: int
    source: str  # "saved-tensors" (CPU: autograd-saved bytes) or "cuda-peak" (torch.cuda.max_memory_allocated)

    def bytes_at(self, length: float) -> float:
        """Bytes of a one-document micro-batch of `length` tokens (the worst composition of that many tokens)."""
        return self.m0 + self.m1 * length + self.m2 * length * length


def fit_activation_bytes(points, source: str) -> ActivationFit:
    """NNLS of [1, sum l, sum l^2] -> bytes over (lengths, bytes) points, in relative error."""
    pts = [(tuple(ls), float(b)) for ls, b in points if b > 0]
    if len(pts) < 3:
        raise TidalError(f"need >= 3 positive activation measurements to fit memory, got {len(pts)}")
    X = np.array([[1.0, float(sum(ls)), float(sum(x * x for x in ls))] for ls, _ in pts])
    y = np.array([b for _, b in pts])
    scale = X.max(axis=0)
    sol, _ = nnls(X / scale / y[:, None], np.ones_like(y))
    m0, m1, m2 = (float(v) for v in sol / scale)
    return ActivationFit(m0, m1, m2, len(pts), source)


def measured_max_len(model: ModelSpec, scheme: ParallelScheme, device: DeviceType, n_devices: int,
                     act: ActivationFit, cfg: MemoryConfig) -> int:
    """MaxLen from measured activations: the largest L with states + PP * act(L) <= budget on the worst rank. The
    states (fp32 master + Adam moments sharded over all devices, this stage's parameters and gradients) are the
    analytic model's; 1F1B keeps up to PP micro-batches' activations on the first stage (as the analytic model)."""
    budget = budget_bytes(device, cfg)
    states = max(stage_memory(model, scheme, n_devices, 0.0, cfg))
    room = (budget - states) / scheme.pp - act.m0
    if room <= 0:
        return 0
    if act.m2 > 0:
        length = (-act.m1 + math.sqrt(act.m1 * act.m1 + 4 * act.m2 * room)) / (2 * act.m2)
    elif act.m1 > 0:
        length = room / act.m1
    else:
        raise TidalError(f"{scheme}: measured activation bytes do not grow with length; cannot derive MaxLen")
    return max(0, int(length))
