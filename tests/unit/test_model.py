"""The plain Llama and the varlen attention backends (one process, no torch.distributed)."""

import dataclasses

import numpy as np
import pytest
import torch

from tidal.core import TidalError, get_model
from tidal.models import Llama, VarlenBatch, VarlenMeta, loss_sum, resolve_backend, varlen_attention
from tidal.models.attention import describe_backend, explain_backend
from tidal.planner.cp_sharding import shard_micro_batch

pytestmark = pytest.mark.unit
TINY = get_model("tiny")


def _qkv(t_q, t_k, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t_q, 4, 16, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(t_k, 2, 16, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(t_k, 2, 16, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _run(backend, q, k, v, meta, seed=0):
    out = varlen_attention(q, k, v, meta, backend=backend)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    return out.detach(), grads


def _cp_meta(lengths, cp, rank, mode):
    rs = shard_micro_batch(lengths, cp, mode).ranks[rank]
    meta = VarlenMeta(torch.from_numpy(rs.cu_seqlens_q.astype(np.int64)), torch.from_numpy(rs.k_start),
                      torch.from_numpy(rs.k_len), rs.max_seqlen_q, rs.max_seqlen_k)
    return meta, rs.num_tokens


@pytest.mark.parametrize("seed", range(4))
def test_sdpa_matches_reference_forward_and_backward(seed):
    """Random packed documents, plain varlen and CP-style overlapping key ranges. Float64 inputs, so the two
    backends (different summation orders) agree to ~1e-15; 1e-10 is far below any masking error (>1e-2)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, size=rng.integers(1, 8)).tolist()
    metas = [(VarlenMeta.from_lengths(lengths), sum(lengths))]
    for mode in ("per-doc", "per-seq"):
        metas.append(_cp_meta(lengths, 2, 1, mode))
    for meta, tq in metas:
        if tq == 0:
            continue
        q, k, v = _qkv(tq, sum(lengths), seed)
        o_ref, g_ref = _run("reference", q, k, v, meta)
        o, g = _run("sdpa", q, k, v, meta)
        torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_flex_forward_matches_reference():
    """FlexAttention has no CPU backward in PyTorch, so on CPU only its forward is compared (fp32: its kernel
    uses a different accumulation order; 1e-5 absolute on O(1) outputs)."""
    lengths = [5, 1, 17, 9]
    q, k, v = _qkv(32, 32, 3, dtype=torch.float32)
    meta = VarlenMeta.from_lengths(lengths)
    with torch.no_grad():
        assert resolve_backend("flex", q, needs_grad=False) == "flex"
        o = varlen_attention(q, k, v, meta, backend="flex")
        o_ref = varlen_attention(q, k, v, meta, backend="reference")
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)


def test_backend_fallback_on_cpu():
    q = torch.zeros(4, 4, 16)
    assert resolve_backend("flash", q, needs_grad=True) == "sdpa"  # no GPU: flash -> flex (no CPU backward) -> sdpa
    assert resolve_backend("auto", q, needs_grad=False) == "sdpa"  # eager flex on CPU is unfused: auto skips it
    assert resolve_backend("flex", q, needs_grad=False) == "flex"  # named: honoured where it runs
    assert resolve_backend("reference", q, needs_grad=True) == "reference"
    with pytest.raises(TidalError):
        resolve_backend("cudnn", q, needs_grad=True)


def test_backend_choice_is_explained():
    chosen, skipped = explain_backend("auto", "cpu", torch.float32, needs_grad=True)
    assert chosen == "sdpa"
    assert [b for b, _ in skipped] == ["flash", "mixed"]  # auto on CUDA is mixed (decision 140)
    assert dict(skipped)["mixed"] == "its flex picks: no FlexAttention backward on CPU"
    line = describe_backend("auto", "cpu", torch.bfloat16)
    assert line.startswith("sdpa (auto; flash: needs CUDA; mixed: its flex picks: ") and line.endswith(")")
    assert describe_backend("mixed", "cpu", torch.bfloat16) == (
        "mixed (mixed; flex picks run sdpa: no FlexAttention backward on CPU)")
    assert explain_backend("reference", "cpu", torch.float32) == ("reference", [])


def test_flex_on_cuda_needs_head_dim_16():
    """Inductor's FlexAttention kernel refuses head dim < 16 on CUDA (seen on an H200): auto and a named flex fall
    back to sdpa there, saying why; from 16 up flex is chosen. (Device strings only: no GPU needed.)"""
    chosen, skipped = explain_backend("auto", "cuda", torch.bfloat16, head_dim=8)
    assert chosen == "sdpa" and dict(skipped)["mixed"] == "its flex picks: compiled kernel needs head dim >= 16, got 8"
    assert explain_backend("auto", "cuda", torch.bfloat16, head_dim=16)[0] in ("flash", "mixed")
    assert explain_backend("flex", "cuda", torch.bfloat16, head_dim=8)[0] == "sdpa"
    assert explain_backend("flex", "cuda", torch.bfloat16, head_dim=16)[0] == "flex"
    assert explain_backend("flex", "cuda", torch.bfloat16)[0] == "flex"  # head dim unknown: not checked


def test_flex_block_mask_is_built_once_per_micro_batch(monkeypatch):
    """Every layer of a micro-batch shares one FlexAttention block mask (cached on the VarlenMeta the layers share);
    a new micro-batch builds its own."""
    import torch.nn.attention.flex_attention as fa

    calls = []
    real = fa.create_block_mask

    def counting(*a, **k):
        calls.append(a[3:5])
        return real(*a, **k)

    monkeypatch.setattr(fa, "create_block_mask", counting)
    torch.manual_seed(0)
    model = Llama(get_model("tiny"), "flex")
    with torch.no_grad():
        for lengths in ([5, 9, 2], [16]):
            x = torch.randint(0, 256, (sum(lengths),))
            out = model(x, VarlenBatch.from_lengths(lengths))
            model.set_attn_backend("sdpa")
            ref = model(x, VarlenBatch.from_lengths(lengths))
            model.set_attn_backend("flex")
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert calls == [(16, 16), (16, 16)]  # one per micro-batch (16 tokens each), not one per layer (6)


def test_fused_projections_equal_separate_ones():
    """One GEMM over [wq; wk; wv] and [w1; w3] computes the same projections as separate calls (fp64: only the
    GEMM's blocking differs)."""
    spec = get_model("tiny")
    torch.manual_seed(0)
    fused = Llama(spec, "sdpa").double()
    torch.manual_seed(0)
    plain = Llama(spec, "sdpa").double()
    plain.set_fused(False)
    x = torch.randint(0, 256, (21,))
    batch = VarlenBatch.from_lengths([4, 17])
    a, b = fused(x, batch), plain(x, batch)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    a.square().sum().backward()
    b.square().sum().backward()
    for (n, p), q in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=n)


def test_documents_are_isolated_and_positions_reset():
    """A document's logits do not depend on what it is packed with: masks stop at document edges and RoPE positions
    restart at 0 in every document (the axolotl #3608 failure mode)."""
    torch.manual_seed(0)
    model = Llama(TINY, "sdpa").double()
    a, b = torch.randint(0, TINY.vocab, (11,)), torch.randint(0, TINY.vocab, (6,))
    packed = model(torch.cat([b, a]), VarlenBatch.from_lengths([6, 11]))
    alone = model(a, VarlenBatch.from_lengths([11]))
    torch.testing.assert_close(packed[6:], alone, rtol=1e-12, atol=1e-12)
    assert VarlenBatch.from_lengths([6, 11]).positions.tolist() == list(range(6)) + list(range(11))
    # the check has teeth: treating the pack as one document changes the second document's logits
    merged = model(torch.cat([b, a]), VarlenBatch.from_lengths([17]))
    assert (merged[6:] - alone).abs().max() > 1e-3


def test_model_shapes_tied_and_params():
    tied = dataclasses.replace(TINY, tie_embeddings=True)
    for spec in (TINY, tied):
        m = Llama(spec, "reference")
        assert sum(p.numel() for p in m.parameters()) == spec.num_params()
        x = torch.randint(0, spec.vocab, (9,))
        out = m(x, VarlenBatch.from_lengths([4, 5]))
        assert out.shape == (9, spec.vocab)
        loss_sum(out, x).backward()
    assert m.output.weight is m.tok_embeddings.weight


def test_backends_agree_through_the_model():
    """Whole tiny model in float64: SDPA and reference backends give the same loss and gradients."""
    x = torch.randint(0, TINY.vocab, (40,), generator=torch.Generator().manual_seed(1))
    batch = VarlenBatch.from_lengths([1, 13, 2, 24])
    grads = {}
    for backend in ("reference", "sdpa"):
        torch.manual_seed(0)
        m = Llama(TINY, backend).double()
        loss_sum(m(x, batch), x).backward()
        grads[backend] = {n: p.grad for n, p in m.named_parameters()}
    for n, g in grads["sdpa"].items():
        torch.testing.assert_close(g, grads["reference"][n], rtol=1e-9, atol=1e-12)


def test_bad_inputs():
    m = Llama(TINY, "reference")
    with pytest.raises(TidalError):
        m(torch.zeros(3, 2, dtype=torch.long), VarlenBatch.from_lengths([3]))
    with pytest.raises(TidalError):
        m(torch.zeros(4, dtype=torch.long), VarlenBatch.from_lengths([3]))
    with pytest.raises(TidalError):
        VarlenBatch.from_lengths([3, 0])
    q, k, v = _qkv(5, 5, 0)
    with pytest.raises(TidalError):
        varlen_attention(q, k, v, VarlenMeta.from_lengths([4]))
    with pytest.raises(TidalError):
        varlen_attention(q, k[:, :1].expand(5, 3, 16), v[:, :1].expand(5, 3, 16), VarlenMeta.from_lengths([5]))
