"""Single-process reference training: the unsharded model, the same documents per step, the same loss
normalisation, clipping and AdamW arithmetic (:func:`tidal.runtime.optim.adamw_update`) as the executor. `tidal
verify` and the executor tests compare against it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tidal.core.model import ModelSpec, param_table
from tidal.models.llama import Llama, VarlenBatch, loss_sum
from tidal.runtime.optim import OptimConfig, adamw_update, clip_scale, lr_at


class ReferenceTrainer:
    def __init__(self, spec: ModelSpec, *, seed: int, dtype: torch.dtype, optim: OptimConfig) -> None:
        torch.manual_seed(seed)
        self.spec, self.cfg = spec, optim
        self.model = Llama(spec, "sdpa").to(dtype)
        named = dict(self.model.named_parameters())
        self.table = param_table(spec)
        self.params = [named[i.name] for i in self.table]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.steps = 0

    def train_step(self, lengths: Sequence[int], documents: Sequence[torch.Tensor]) -> float:
        """One step over `documents` (each ``length + 1`` tokens) as one packed batch; returns the mean token loss
        (nan and no update for an empty step, as the executor does)."""
        if not lengths:
            return float("nan")
        for p in self.params:
            p.grad = None
        x = torch.cat([d[:-1] for d in documents]).long()
        y = torch.cat([d[1:] for d in documents]).long()
        loss = loss_sum(self.model(x, VarlenBatch.from_lengths(lengths)), y) / float(sum(lengths))
        loss.backward()
        grads = [p.grad for p in self.params]
        norm = float(torch.stack([g.double().pow(2).sum() for g in grads]).sum().sqrt())
        scale = clip_scale(norm, self.cfg.clip)
        lr = lr_at(self.steps, self.cfg)
        self.steps += 1
        with torch.no_grad():
            for p, g, m, v, info in zip(self.params, grads, self.m, self.v, self.table):
                adamw_update(p, g * scale, m, v, step=self.steps, lr=lr, cfg=self.cfg, decay=len(info.shape) > 1)
        return float(loss.detach())

    def state(self) -> dict[str, dict[str, np.ndarray]]:
        names = [i.name for i in self.table]
        return {"params": {n: p.detach().numpy().copy() for n, p in zip(names, self.params)},
                "m": {n: t.numpy().copy() for n, t in zip(names, self.m)},
                "v": {n: t.numpy().copy() for n, t in zip(names, self.v)}}


def max_rel_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, str]:
    """max over tensors of max|a - b| / max|b| (b the reference), and the worst tensor's name."""
    worst, name = 0.0, ""
    for n, ref in b.items():
        scale = float(np.abs(ref).max()) or 1.0
        d = float(np.abs(a[n].astype(np.float64) - ref.astype(np.float64)).max()) / scale
        if d > worst or not name:
            worst, name = d, n
    return worst, name
