"""The executor's memory layout on one process: fused projections read one storage without a copy, gradients land
per named view, and a 16-bit model accumulates its gradients across micro-batches in fp32 (runtime/flat.py
`FlatStage`, models/llama.py `fuse_storage`)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tidal.core import get_model
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.models.llama import _fused_view, storage_blocks
from tidal.runtime.flat import FlatStage as _Flat


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.cats = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.cat.default:
            self.cats.append(tuple(out.shape))
        return out


def _step(model, spec, n_mb=1, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_mb):
        toks = torch.randint(0, spec.vocab, (length + 1,), generator=g)
        (loss_sum(model(toks[:-1], VarlenBatch.from_lengths([length])), toks[1:]) / (n_mb * length)).backward()


def test_fused_projections_are_views_of_one_storage_and_never_copied():
    spec = get_model("tiny")
    torch.manual_seed(0)
    model = Llama(spec, "sdpa").double()  # casting reallocates: the blocks are fused again
    a, f = model.layers["0"].attention, model.layers["0"].feed_forward
    for ps in (a.fused_params(), f.fused_params()):
        fused = _fused_view(ps)
        assert fused is not None and fused.shape[0] == sum(p.shape[0] for p in ps)
        assert all(p.untyped_storage().data_ptr() == ps[0].untyped_storage().data_ptr() for p in ps)
    weight_shapes = {tuple(_fused_view(m.fused_params()).shape) for m in (a, f)}
    with _Ops() as ops:
        _step(model, spec)
    assert not weight_shapes & set(ops.cats), ops.cats  # no weight concatenation in forward or backward
    assert [b for b in storage_blocks(model) if len(b) > 1][:2] == [a.fused_params(), f.fused_params()]


def test_gradients_land_per_named_view_of_one_fused_gradient():
    """Named gradients equal an unfused model's (float64, rtol 1e-12), and under the executor's flat buffers they are
    adjacent views of one gradient buffer, block for block like the parameters."""
    spec = get_model("tiny")
    torch.manual_seed(0)
    fused = Llama(spec, "sdpa").double()
    plain = Llama(spec, "sdpa").double()
    plain.load_state_dict(fused.state_dict())
    plain.set_fused(False)
    _step(fused, spec, n_mb=2)
    _step(plain, spec, n_mb=2)
    for (n, p), q in zip(fused.named_parameters(), plain.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=1e-15), n
    flat = _Flat(fused, torch.float64)
    flat.alloc_params()
    with torch.no_grad():
        for p, q in zip(fused.parameters(), plain.parameters()):
            p.copy_(q)
    for p in fused.parameters():
        p.grad = None
    _step(fused, spec, n_mb=2)
    a = fused.layers["1"].attention
    views = [p.main_grad for p in a.fused_params()]
    assert _fused_view(views) is not None  # wq/wk/wv gradients: row blocks of one fused gradient
    for p, q in zip(fused.parameters(), plain.parameters()):
        assert p.grad is None and torch.allclose(p.main_grad, q.grad, rtol=1e-12, atol=1e-15)
    flat.free_params()
    flat.free_grads()
    assert flat.params.untyped_storage().nbytes() == 0
    assert all(g.untyped_storage().nbytes() == 0 for g in flat.grads.values())


def _grads(dtype, n_mb, fp32_buffer):
    spec = get_model("tiny")
    torch.manual_seed(0)
    w = {k: v.detach().to(torch.bfloat16).double() for k, v in Llama(spec, "sdpa").named_parameters()}
    model = Llama(spec, "sdpa").to(dtype)
    if fp32_buffer:
        _Flat(model, torch.float32 if dtype == torch.bfloat16 else dtype).alloc_params()
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(w[k])  # the same (bf16-representable) weights in every run
    _step(model, spec, n_mb=n_mb, length=32)
    return {k: (p.main_grad if fp32_buffer else p.grad).double() for k, p in model.named_parameters()}


def _l2(a, b):
    return float((sum(((a[k] - b[k]) ** 2).sum() for k in b) / sum((b[k] ** 2).sum() for k in b)).sqrt())


def test_bf16_gradients_accumulate_in_fp32_across_micro_batches():
    """bf16 compute against float64 over 4 and 64 micro-batches: with the fp32 buffer the relative L2 error stays at
    the bf16 compute error (measured 6.2e-3 and 6.9e-3; asserted <= 1e-2 and at most 1.25x growth); accumulating in
    bf16 grows it (measured 6.7e-3 -> 1.14e-2), which the fp32 buffer must beat by 1.4x at 64 micro-batches."""
    errs = {}
    for n in (4, 64):
        ref = _grads(torch.float64, n, False)
        errs[n] = (_l2(_grads(torch.bfloat16, n, True), ref), _l2(_grads(torch.bfloat16, n, False), ref))
    assert errs[64][0] <= 1e-2 and errs[64][0] <= 1.25 * errs[4][0], errs
    assert errs[64][1] >= 1.4 * errs[64][0], errs
