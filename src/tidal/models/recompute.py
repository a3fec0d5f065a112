"""Activation recomputation and offload as plain module options (never imports torch.distributed).

Modes per transformer layer (``Block.recompute``), as Megatron-LM defines them:

* ``"none"``: autograd keeps every activation the layer's backward needs.
* ``"full"``: only the layer's input is kept (plus cos/sin, shared by every layer); the whole layer is run again in
  the backward (``torch.utils.checkpoint``, ``use_reentrant=False``). Everything inside the layer runs again,
  TP's ``tp_in``/``tp_out`` collectives and CP's K/V exchange included: every rank of a stage's TP and CP groups
  recomputes the same layers in the same order, so the collectives still match (the mode is a property of the stage).
* ``"selective"``: only the attention core (:func:`tidal.models.attention.varlen_attention`, the softmax(QK^T)V
  part) is recomputed; the linear layers' activations are kept, so q, k, v (its inputs) and its output (``wo``'s
  input) stay. What it frees is what the attention kernel saves beyond those: the [Tq, Tk] probabilities of the
  ``reference`` backend or a math SDPA kernel, the logsumexp of flash / flex / CPU-flash SDPA.

Module forward pre-hooks fire again when a layer is recomputed (a full recompute calls ``Block.forward`` again);
the executor's pull hooks are idempotent (``PullStream.need`` of a landed group is a no-op), tests/unit/
test_recompute.py checks it.

Offload (``Block.offload``): the layer's saved activations go to host memory between its forward and its backward
through :class:`OffloadHooks` (``saved_tensors_hooks``): pinned host copies posted non-blocking from a CUDA tensor,
copied back when the backward unpacks them. A tensor already on the host is kept as it is: on CPU the hooks run
(every saved tensor goes through pack/unpack) and move nothing, a no-op path that is exercised and tested.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.checkpoint import checkpoint

from tidal.core.errors import TidalError
from tidal.core.recompute import MODES


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise TidalError(f"recompute must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def recomputed(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` whose intermediate activations are recomputed in the backward (non-reentrant
    checkpoint; Tidal's layers draw no random numbers, so no RNG state is saved). Without grad it is a plain call."""
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)


class OffloadHooks(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors go to host memory (pinned, non-blocking) between forward and backward; host tensors stay put.
    `packed` / `moved` count the tensors seen and the bytes moved off the device (observable in tests)."""

    def __init__(self) -> None:
        self.packed = 0
        self.moved = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        self.packed += 1
        if t.device.type in ("cpu", "meta"):  # already in host memory, or no storage at all
            return t
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=t.device.type == "cuda",
                           device="cpu")
        host.copy_(t, non_blocking=True)
        self.moved += t.numel() * t.element_size()
        return (t.device, host)

    @staticmethod
    def _unpack(x):
        if isinstance(x, torch.Tensor):
            return x
        device, host = x
        return host.to(device, non_blocking=True)


def layer_modes(spec: str | Mapping[int, str] | None, layers) -> dict[int, str]:
    """Per global layer index of `layers`, its mode: one mode for all, or a mapping (layers it omits: "none")."""
    if spec is None:
        return {int(i): "none" for i in layers}
    if isinstance(spec, str):
        return {int(i): check_mode(spec) for i in layers}
    held = {int(i) for i in layers}
    for i in spec:
        if int(i) not in held:
            raise TidalError(f"recompute names layer {i}, which this model (layers {sorted(held)}) does not hold")
    return {i: check_mode(spec.get(i, "none")) for i in sorted(held)}


__all__ = ["MODES", "OffloadHooks", "check_mode", "layer_modes", "recomputed"]
