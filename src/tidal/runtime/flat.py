"""A candidate stage's parameters and gradients in flat buffers that hold storage only while needed (decisions 72,
75): runtime/executor.py builds one per candidate stage on this rank."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tidal.models.llama import fuse_storage, storage_blocks


class FlatStage:
    """One candidate's stage on this rank: its parameters (compute dtype) are views of one flat buffer, and their
    gradients (`main_grad`, at least fp32) views of one flat buffer per parameter group (`group_of`: parameter id ->
    group; default one group), so each group's gradients can be freed as soon as its push is posted. Each buffer
    holds storage only while the candidate's step needs it (storage resized to zero otherwise), so idle candidates
    hold nothing. Fused blocks (q/k/v, gate/up) are adjacent, so their GEMM reads one tensor without a copy and their
    gradient blocks are views of one fused gradient. A post-accumulate hook adds each micro-batch's `.grad` into
    `main_grad`, drops it and tells `on_grad(group)`."""

    ALIGN = 64  # elements: every block starts at a multiple (aligned GEMM operands)

    def __init__(self, model: torch.nn.Module, grad_dtype: torch.dtype, group_of: dict[int, int] | None = None,
                 on_grad: Callable[[int], None] | None = None) -> None:
        blocks = storage_blocks(model)
        group_of = group_of or {}
        offsets, goffsets, off, goff = [], [], 0, {}
        for b in blocks:
            n = sum(p.numel() for p in b)
            g = group_of.get(id(b[0]), 0)
            offsets.append(off)
            goffsets.append((g, goff.get(g, 0)))
            off = -(-(off + n) // self.ALIGN) * self.ALIGN
            goff[g] = -(-(goff.get(g, 0) + n) // self.ALIGN) * self.ALIGN
        p0 = blocks[0][0]
        self.params = torch.empty(off, dtype=p0.dtype, device=p0.device)
        self.grads = {g: torch.empty(n, dtype=grad_dtype, device=p0.device) for g, n in goff.items()}
        self._group: dict[int, int] = {}
        for b, o, (g, go) in zip(blocks, offsets, goffsets):
            n = sum(p.numel() for p in b)
            fuse_storage(b, self.params[o:o + n])
            for p in b:
                p.main_grad = self.grads[g][go:go + p.numel()].view_as(p)
                p.register_post_accumulate_grad_hook(self._accumulate)
                self._group[id(p)] = g
                go += p.numel()
        self.on_grad = on_grad
        self._live = set(self.grads)
        self.free_params()
        self.free_grads()

    def _accumulate(self, p: torch.nn.Parameter) -> None:
        g = self._group[id(p)]
        self.alloc_grads(g)
        p.main_grad.add_(p.grad)
        p.grad = None
        if self.on_grad is not None:
            self.on_grad(g)

    def alloc_params(self) -> None:
        st = self.params.untyped_storage()
        if st.nbytes() == 0:
            st.resize_(self.params.numel() * self.params.element_size())

    def free_params(self) -> None:
        self.params.untyped_storage().resize_(0)

    def alloc_grads(self, g: int | None = None) -> None:
        """Storage (zeroed) for group g's gradients, or every group's; a no-op where it is live."""
        for h in (self.grads if g is None else (g,)):
            if h not in self._live:
                buf = self.grads[h]
                buf.untyped_storage().resize_(buf.numel() * buf.element_size())
                buf.zero_()
                self._live.add(h)

    def free_grads(self, g: int | None = None) -> None:
        for h in (list(self.grads) if g is None else (g,)):
            self.grads[h].untyped_storage().resize_(0)
            self._live.discard(h)


__all__ = ["FlatStage"]
