"""AdamW on fully-sharded master parameters (Hydraulis' optimisation phase, §5.2), global-norm clipping and the
learning-rate schedule.

The master copy and both Adam moments of every parameter are split along dim 0 over *all* N ranks of the world
(:func:`shard_range`, the ``fully_sharded`` layout of the resharding engine). The layout never depends on the
parallel strategy of a step, so switching strategies never moves optimizer state.

:func:`adamw_update` is the one elementwise update both the sharded optimizer and the single-process reference
(`tidal verify`) call, so the two perform the same arithmetic element by element; only the global gradient norm is
summed in a different order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tidal.core.errors import TidalError
from tidal.core.limits import MAX_LR, check_finite
from tidal.runtime.reshard.annotation import split_range


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # decoupled (AdamW), on matrices only; norm weights are not decayed
    clip: float = 1.0  # max global gradient norm; 0 disables clipping
    warmup_steps: int = 10
    decay_steps: int = 1000  # cosine decay from lr to min_lr over these steps after warmup
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        # non-finite or absurd values are refused here, before any rank starts (decision 81)
        check_finite(self.lr, "optimizer.lr", low=0.0, high=MAX_LR, low_open=True)
        for k in ("beta1", "beta2"):
            check_finite(getattr(self, k), f"optimizer.{k}", low=0.0, high=1.0, high_open=True)
        check_finite(self.eps, "optimizer.eps", low=0.0, high=1.0, low_open=True)
        check_finite(self.weight_decay, "optimizer.weight_decay", low=0.0, high=1.0)
        check_finite(self.clip, "optimizer.clip", low=0.0)
        check_finite(self.min_lr_ratio, "optimizer.min_lr_ratio", low=0.0, high=1.0)
        if self.warmup_steps < 0 or self.decay_steps < 1:
            raise TidalError("optimizer: warmup_steps >= 0, decay_steps >= 1")


def lr_at(step: int, cfg: OptimConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = min(1.0, (step - cfg.warmup_steps) / cfg.decay_steps)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + 0.5 * (cfg.lr - lo) * (1.0 + math.cos(math.pi * t))


def shard_range(rows: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of a dim-0 split of `rows` over `world` ranks (earlier ranks take the remainder), the same
    split as the resharding engine's ``fully_sharded`` annotation."""
    return split_range(0, rows, world, rank)


def adamw_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, step: int, lr: float,
                 cfg: OptimConfig, decay: bool) -> None:
    """One AdamW update in place (torch.optim.AdamW's arithmetic). `step` counts from 1."""
    b1, b2 = cfg.beta1, cfg.beta2
    if decay and cfg.weight_decay:
        p.mul_(1.0 - lr * cfg.weight_decay)
    m.mul_(b1).add_(g, alpha=1.0 - b1)
    v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
    denom = (v / (1.0 - b2**step)).sqrt_().add_(cfg.eps)
    p.addcdiv_(m, denom, value=-lr / (1.0 - b1**step))


def clip_scale(norm: float, clip: float) -> float:
    return 1.0 if clip <= 0 or norm <= clip else clip / (norm + 1e-6)


class ShardedAdamW:
    """AdamW over this rank's master shards (one per parameter; rows ``shard_range`` of dim 0). `decay[i]` says
    whether parameter i gets weight decay. The global gradient norm is all-reduced over `group` (the world)."""

    def __init__(self, shards: list[torch.Tensor], decay: list[bool], cfg: OptimConfig, group=None) -> None:
        if len(shards) != len(decay):
            raise TidalError(f"{len(shards)} shards but {len(decay)} decay flags")
        self.params = shards
        self.decay = decay
        self.cfg = cfg
        self.group = group
        self.m = [torch.zeros_like(p) for p in shards]
        self.v = [torch.zeros_like(p) for p in shards]
        self.steps = 0

    def step(self, grads: list[torch.Tensor], bad: bool = False) -> dict:
        """Clip by the global norm, then update. Returns {"grad_norm", "lr", "clip_scale", "skipped", "local_bad"}.

        Non-finite guard (decision 81): `bad` says this rank saw a non-finite value of its own (its loss); it travels
        in the same all-reduce as the squared norm (one collective, as before), so every rank learns that some rank
        had a non-finite loss or gradient and all skip the update together: parameters, moments and the step count
        (hence the learning-rate schedule) stay as they were."""
        if len(grads) != len(self.params):
            raise TidalError(f"{len(grads)} gradient shards for {len(self.params)} parameters")
        acc = torch.zeros(2, dtype=torch.float64, device=self.params[0].device if self.params else "cpu")
        for g in grads:
            acc[0] += g.double().pow(2).sum()
        acc[1] = (~torch.isfinite(acc[0])).double() + (1.0 if bad else 0.0)  # on the device: no extra host sync
        local = acc[1:].clone()
        if dist.is_initialized():
            dist.all_reduce(acc, group=self.group)
        sq, flags, mine = torch.cat([acc, local]).tolist()
        norm, local_bad = math.sqrt(sq) if sq >= 0 else math.nan, mine > 0
        lr = lr_at(self.steps, self.cfg)
        if flags > 0 or not math.isfinite(norm):
            return {"grad_norm": norm, "lr": lr, "clip_scale": 0.0, "skipped": 1.0, "local_bad": float(local_bad)}
        scale = clip_scale(norm, self.cfg.clip)
        self.steps += 1
        for p, g, m, v, d in zip(self.params, grads, self.m, self.v, self.decay):
            adamw_update(p, g.to(p.dtype) * scale, m, v, step=self.steps, lr=lr, cfg=self.cfg, decay=d)
        return {"grad_norm": norm, "lr": lr, "clip_scale": scale, "skipped": 0.0, "local_bad": 0.0}

    def finite(self) -> bool:
        """Whether this rank's parameters and moments are all finite (checked before every checkpoint)."""
        return all(bool(torch.isfinite(t).all()) for ts in (self.params, self.m, self.v) for t in ts)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "params": self.params, "m": self.m, "v": self.v}
