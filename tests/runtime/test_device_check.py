"""Device correctness, proven on CPU (`python -m pytest -m device_check`).

Two checks, because a CPU build has no second real device:

* the model's forward and backward on the ``meta`` device (every parameter, token and batch tensor there): a tensor
  created on the CPU and mixed with a meta tensor raises, and so does any read of a device value on the host
  (``.tolist()``/``.item()``/``int()`` of a meta tensor), so the run proves both "every tensor on the model's device"
  and "no host sync in the forward/backward";
* :class:`_devicecheck.DeviceChecker` (a TorchFunctionMode) around the same model on the CPU, and around the runtime's
  pipeline (TP with and without sequence parallelism, CP, PP, tied embeddings) in spawned gloo ranks, where meta
  cannot go: it flags every factory call in tidal's code without ``device=``, every op mixing devices, and (for the
  model) every host read.

Both fail on the old RoPE code (``torch.arange`` with no device): test_old_rope_is_caught_*.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tidal.core import get_model
from tidal.core.errors import TidalError
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.models import llama as llama_mod
from tidal.runtime.launch import run_distributed

from _devicecheck import TIDAL_DIR, DeviceChecker  # isort: skip
from _device_cases import runtime_worker  # isort: skip

pytestmark = pytest.mark.device_check

TINY = get_model("tiny")
LENS = [37, 5, 20, 2]


def old_rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """The RoPE of issue 23 before the fix, verbatim: `inv` is built on the default device (the CPU)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def model_step(device: str, backend: str = "sdpa", fused: bool = True, spec=TINY):
    """Forward + backward of the whole model with parameters, tokens and batch on `device`, under the checker."""
    with torch.device(device):
        model = Llama(spec, backend, seed=0)
    model.set_fused(fused)
    toks = torch.randint(0, spec.vocab, (sum(LENS) + 1,), device=device)
    batch = VarlenBatch.from_lengths(LENS, device=device)
    with DeviceChecker(watch=(TIDAL_DIR, __file__), host_reads=True) as dc:
        loss = loss_sum(model(toks[:-1], batch), toks[1:])
        loss.backward()
    return model, loss, dc.findings


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("fused", [True, False])
def test_model_forward_backward_on_meta(backend, fused):
    model, loss, findings = model_step("meta", backend, fused, dataclasses.replace(TINY, tie_embeddings=fused))
    assert loss.is_meta and findings == [], [str(f) for f in findings]
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.is_meta and p.grad.shape == p.shape, n


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_model_forward_backward_on_cpu_checked(backend):
    model, loss, findings = model_step("cpu", backend)
    assert torch.isfinite(loss) and findings == [], [str(f) for f in findings]
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_recompute_and_offload_are_device_clean(device):
    """Full and selective recomputation and the offload hooks (decision 90): no factory without a device, no
    mixed-device op and no host read, recomputation in the backward included."""
    with torch.device(device):
        model = Llama(TINY, "sdpa", seed=0)
    model.set_recompute({0: "full", 1: "selective", 3: "full"}, offload=(0, 1, 2))
    toks = torch.randint(0, TINY.vocab, (sum(LENS) + 1,), device=device)
    batch = VarlenBatch.from_lengths(LENS, device=device)
    with DeviceChecker(watch=(TIDAL_DIR, __file__), host_reads=True) as dc:
        loss = loss_sum(model(toks[:-1], batch), toks[1:])
        loss.backward()
    assert dc.findings == [], [str(f) for f in dc.findings]
    assert all(p.grad is not None for p in model.parameters())


def test_old_rope_is_caught_by_the_checker():
    """The old formula, run under the checker on the CPU, is flagged (a factory without device=); on meta positions
    it is flagged as a mixed-device op and raises."""
    pos = torch.arange(10, device="cpu")
    with DeviceChecker(watch=(__file__,)) as dc:
        old_rope_cos_sin(pos, 16, 10000.0, torch.float32)
    assert [(f.kind, f.op) for f in dc.findings] == [("factory", "arange")], dc.findings
    assert "old_rope_cos_sin" in dc.findings[0].where
    with DeviceChecker(watch=(__file__,)) as dc, pytest.raises(RuntimeError, match="device"):
        old_rope_cos_sin(pos.to("meta"), 16, 10000.0, torch.float32)
    assert "mixed" in {f.kind for f in dc.findings}
    with DeviceChecker(watch=(__file__,)) as dc:  # the fixed one is clean
        llama_mod.rope_cos_sin(pos, 16, 10000.0, torch.float32)
    assert dc.findings == []


def test_old_rope_is_caught_in_the_model(monkeypatch):
    """With the old RoPE swapped into the model, the model checks of this file fail: on meta with an error, on the
    CPU with a finding."""
    monkeypatch.setattr(llama_mod, "rope_cos_sin", old_rope_cos_sin)
    with pytest.raises(RuntimeError, match="device"):
        model_step("meta")
    _, _, findings = model_step("cpu")
    assert [(f.kind, f.op) for f in findings] == [("factory", "arange")], findings


def test_backward_of_custom_functions_is_checked():
    """Python autograd Functions' backward (TP/CP collectives) runs under the mode: a factory there is flagged."""

    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * torch.ones(g.shape[0])[:, None]  # no device=

    x = torch.ones(3, 2, device="cpu", requires_grad=True)
    with DeviceChecker(watch=(__file__,)) as dc:
        Bad.apply(x).sum().backward()
    assert [(f.kind, f.op) for f in dc.findings] == [("factory", "ones")]
    assert "backward" in dc.findings[0].where


def test_model_refuses_a_batch_on_another_device():
    model = Llama(TINY, "sdpa", seed=0)
    toks = torch.randint(0, TINY.vocab, (10,), device="cpu")
    with pytest.raises(TidalError, match="move it"):
        model(toks, VarlenBatch.from_lengths([10], device="meta"))


def test_batch_to_device_is_one_copy_and_keeps_host_lists():
    b = VarlenBatch.from_lengths(LENS)
    x = torch.arange(sum(LENS), device="cpu")
    with DeviceChecker(watch=(TIDAL_DIR,), host_reads=True) as dc:
        moved, (xm,) = llama_mod.batch_to_device(b, "meta", x)
    assert dc.findings == [], dc.findings
    assert moved.positions.is_meta and moved.meta.k_len.is_meta and xm.is_meta and xm.shape == x.shape
    assert moved.meta.host == b.meta.host and moved.meta.max_seqlen_q == max(LENS)
    with pytest.raises(TidalError, match="int64"):
        llama_mod.batch_to_device(b, "meta", x.float())
    assert moved.to("meta") is moved  # already there: no copy


# the one host read a pipeline step makes (docs/runtime.md, "Host syncs"): the step's loss, reported as a float, once
# per step in run_pipeline. Any other host read in tidal's step code fails the test.
KNOWN_HOST_READS = ("tidal/runtime/pipeline.py:",)


@pytest.mark.distributed
def test_runtime_pipeline_is_device_clean():
    """TP (fused, unfused, sequence parallel), CP, PP and tied embeddings on 4 gloo ranks, the stage model's
    construction and run_pipeline's forward and backward under the checker: no factory without a device and no
    mixed-device op anywhere in tidal's code, and no host read beyond KNOWN_HOST_READS (none in models/)."""
    per_rank = run_distributed(runtime_worker, 4, timeout_s=600)
    for rank, cases in enumerate(per_rank):
        assert len(cases) == 5, (rank, cases)
        for name, findings in cases:
            bad = [f for f in findings if f.kind != "host-read" or not f.where.startswith(KNOWN_HOST_READS)]
            assert bad == [], (rank, name, [str(f) for f in bad])
            loss_reads = [f for f in findings if f.where.startswith("tidal/runtime/pipeline.py:")]
            assert len(loss_reads) == 1 and "run_pipeline" in loss_reads[0].where, loss_reads
