"""The per-micro-batch attention backend ("mixed", decision 119; `auto` on CUDA since decision 140).

What is tested where:

* the choice function (`core.attnrule.AttnBackendRule`) alone: the fitted H200 rule picks sdpa on one long document
  and flex on many short ones, its threshold is where the fitted constants put it, bad input fails in one line;
* the dispatch (`models.attention.pick_backend`): decided once per micro-batch from the host lists (tensors on the
  meta device, so nothing can be read back), cached on the VarlenMeta, counted once per micro-batch;
* numerics against "reference" in float64 (tolerance rtol = atol = 1e-10, as `tidal verify`'s parameters): on CPU
  FlexAttention has no backward, so micro-batches that pick flex are compared FORWARD-ONLY (no grad: eager flex
  runs); with gradients a flex pick runs sdpa on CPU (said by `describe_backend`, counted as sdpa), and output and
  gradients are compared for micro-batches of both picks. The compiled flex path with gradients is
  tests/runtime/test_cuda.py's (`cuda` marker, skipped without a GPU).
"""

import dataclasses

import pytest
import torch

from tidal.core import get_model
from tidal.core.attnrule import H200_RULE, AttnBackendRule, causal_pairs
from tidal.core.errors import TidalError
from tidal.models import Llama, VarlenBatch, VarlenMeta, loss_sum, varlen_attention
from tidal.models.attention import AttentionKernels, describe_backend, explain_backend, pick_backend

TOL = {"rtol": 1e-10, "atol": 1e-10}
SHORT = [5] * 40  # tiny's heads (8 x 8): flex by the H200 rule
LONG = [200]  # one document: sdpa


def test_rule_picks_sdpa_on_one_long_document_and_flex_on_many_short():
    heads, dim = 32, 128  # llama2-7b, the fit's model
    assert H200_RULE.pick_lengths([16384], heads, dim) == "sdpa"
    assert H200_RULE.pick_lengths([12220, 4164], heads, dim) == "sdpa"
    assert H200_RULE.pick_lengths([64] * 16, heads, dim) == "flex"
    assert H200_RULE.pick_lengths([1024] * 16, heads, dim) == "flex"
    # the threshold in documents of 64 tokens: flex from the first S with seg_cost * S > flex_const + flex_work * W
    r, per_doc = H200_RULE, heads * dim * causal_pairs(64, 64)
    first = next(s for s in range(1, 100) if r.seg_cost * s > r.flex_const + r.flex_work * per_doc * s)
    assert first == 7  # 1.89e-3 / (2.82e-4 - 3.55e-14 * 4096 * 2080) = 6.7 documents
    assert r.pick_lengths([64] * (first - 1), heads, dim) == "sdpa"
    assert r.pick_lengths([64] * first, heads, dim) == "flex"
    # narrower heads (a TP shard) make flex's extra work smaller: flex from fewer long documents
    assert r.pick_lengths([4096] * 16, heads, dim) == "sdpa" and r.pick_lengths([4096] * 16, 4, dim) == "flex"
    # CP pieces: a segment's queries see its earlier keys too (bottom-right causal), so the work counts them
    assert causal_pairs(2, 5) == 2 * 3 + 3 and r.margin([2], [5], 1, 1) == pytest.approx(
        r.seg_cost - r.flex_const - r.flex_work * 9)


@pytest.mark.parametrize("bad, match", [
    (lambda: AttnBackendRule(-1.0, 1e-3, 1e-14), "seg_cost must be a finite number >= 0"),
    (lambda: AttnBackendRule(1e-4, float("nan"), 1e-14), "flex_const must be a finite number >= 0"),
    (lambda: AttnBackendRule(1e-4, 1e-3, "fast"), "flex_work must be a finite number >= 0"),
    (lambda: H200_RULE.pick([4, 4], [4], 8, 8), "2 query lengths but 1 key lengths"),
    (lambda: H200_RULE.pick([5], [4], 8, 8), "0 <= queries <= keys"),
    (lambda: H200_RULE.pick_lengths([-3], 8, 8), "0 <= queries <= keys"),
    (lambda: H200_RULE.pick_lengths([4], 0, 8), "heads and head dim must be ints >= 1"),
    (lambda: AttentionKernels(rule="h200"), "must be an AttnBackendRule, got str"),
])
def test_bad_rule_input_fails_in_one_line(bad, match):
    with pytest.raises(TidalError, match=match) as e:
        bad()
    assert "\n" not in str(e.value)


def test_the_pick_is_made_once_per_micro_batch_from_the_host_lists():
    """Tensors on the meta device cannot be read: the pick uses VarlenMeta.host and q's shape only. Every layer
    reuses the cached pick; a micro-batch is counted once however many layers (or recomputations) ask."""
    kernels = AttentionKernels()
    for lengths, want in ((SHORT, "flex"), (LONG, "sdpa"), (SHORT, "flex")):
        meta = VarlenMeta.from_lengths(lengths).to("meta")
        q = torch.empty(sum(lengths), 8, 8, device="meta")
        for _ in range(3):  # three layers
            assert pick_backend(meta, q, needs_grad=False, kernels=kernels) == want
    assert kernels.picks == {"flex": 2, "sdpa": 1}
    # a rule that never pays for segments always picks sdpa: the rule is the kernels' value, not a global
    never = AttentionKernels(dataclasses.replace(H200_RULE, seg_cost=0.0))
    assert pick_backend(VarlenMeta.from_lengths(SHORT), torch.empty(200, 8, 8), False, never) == "sdpa"


def _qkv(t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t, h, 8, generator=g, dtype=torch.float64) for h in (8, 4, 4)]


def test_mixed_forward_matches_reference_on_both_picks():
    for lengths, want in ((SHORT, "flex"), (LONG, "sdpa")):
        q, k, v = _qkv(sum(lengths))
        kernels = AttentionKernels()
        with torch.no_grad():
            out = varlen_attention(q, k, v, VarlenMeta.from_lengths(lengths), backend="mixed", kernels=kernels)
            ref = varlen_attention(q, k, v, VarlenMeta.from_lengths(lengths), backend="reference")
        assert kernels.picks == {want: 1}  # forward-only: a flex pick runs (eager) flex on CPU
        torch.testing.assert_close(out, ref, **TOL)


def test_mixed_model_trains_like_reference():
    """Loss and every gradient of tiny in float64 under "mixed" vs "reference", one micro-batch of each pick. With
    gradients on CPU the flex pick runs sdpa (no FlexAttention backward here), and says so."""
    spec = get_model("tiny")
    assert describe_backend("mixed", "cpu", torch.float64) == (
        "mixed (mixed; flex picks run sdpa: no FlexAttention backward on CPU)")
    mixed = Llama(spec, "mixed", seed=3).double()
    ref = Llama(spec, "reference", seed=3).double()
    g = torch.Generator().manual_seed(1)
    for lengths in (SHORT, LONG):
        toks = torch.randint(0, spec.vocab, (sum(lengths) + 1,), generator=g)
        losses = []
        for model in (mixed, ref):
            model.zero_grad()
            loss = loss_sum(model(toks[:-1], VarlenBatch.from_lengths(lengths)), toks[1:])
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], **TOL)
        for (n, a), b in zip(mixed.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **TOL, msg=n)
    assert mixed.attn_picks == {"sdpa": 2}


def test_auto_is_mixed_on_cuda_without_flash_and_unchanged_on_cpu():
    """(Device strings only: no GPU needed.) On CUDA with flex's head width, auto runs the per-micro-batch choice
    (unless flash-attn is installed): decision 140 measured it at 1.07-1.09x flex's tokens/s in training once sdpa
    left cuDNN out; narrower heads fall back to sdpa; on CPU auto stays sdpa, so `tidal verify`'s CPU runs are
    untouched."""
    chosen, skipped = explain_backend("auto", "cuda", torch.bfloat16, head_dim=128)
    assert chosen in ("flash", "mixed") and (chosen == "flash" or skipped[0][0] == "flash")
    assert "flex" not in dict(skipped)
    chosen, skipped = explain_backend("auto", "cuda", torch.bfloat16, head_dim=8)
    assert chosen in ("flash", "sdpa")
    assert chosen == "flash" or dict(skipped)["mixed"] == "its flex picks: compiled kernel needs head dim >= 16, got 8"
    assert explain_backend("auto", "cpu", torch.float64)[0] == "sdpa"
    assert explain_backend("mixed", "cpu", torch.float64) == ("mixed", [])  # named: runs anywhere
    assert explain_backend("mixed", "cuda", torch.bfloat16, head_dim=128) == ("mixed", [])


def test_sdpa_on_cuda_never_asks_for_cudnn():
    """sdpa's kernels on CUDA (decision 133): cuDNN's is left out (a graph per new document length), the math kernel
    stays last, so every shape and mask still has a kernel; PyTorch's order otherwise."""
    from torch.nn.attention import SDPBackend

    from tidal.models.attention import SDPA_CUDA_KERNELS
    assert SDPBackend.CUDNN_ATTENTION not in SDPA_CUDA_KERNELS
    assert SDPA_CUDA_KERNELS[-1] == SDPBackend.MATH and SDPBackend.FLASH_ATTENTION in SDPA_CUDA_KERNELS


def test_the_train_summary_says_which_backend_ran_how_many_micro_batches():
    from rich.console import Console

    from tidal.cli.render import train_summary

    con = Console(width=200, record=True)
    row = dict(strategy="2*tp1", tokens=10, loss=1.0, critical_path_s=1.0, wall_s=1.0, pull_s=0.0, push_s=0.0,
               attn_backend="mixed (mixed)")
    train_summary(con, [{**row, "attn_picks": {"sdpa": 3, "flex": 1}}, {**row, "attn_picks": {"sdpa": 0, "flex": 4}}])
    assert ("attention backend: mixed (mixed); per micro-batch: flex 5, sdpa 3 "
            "(stage micro-batches, summed over ranks)") in con.export_text()
