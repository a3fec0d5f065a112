"""The runtime on a CUDA device (skipped without one; run them on a GPU machine: `python -m pytest -m cuda`).

Tolerances:

* fp32 CUDA (sdpa, flex) vs fp32 CPU: kernel order only, TF32 switched off for the comparison: rtol 1e-4 on the loss
  and on gradients scaled by their tensor's maximum;
* flash (bf16 only) vs the fp32 CPU reference: the model runs in bf16 (parameters, activations; logits and the loss
  upcast). The same comparison of bf16 sdpa on the CPU against fp32 gives loss 6.3e-6 and gradients 1.6e-2 of their
  maximum (this file's `_run`, measured here), so: loss rel 1e-3, gradients 1e-1 of their tensor's maximum (a wrong
  mask or a dropped segment moves the loss by > 1e-2). Also flash bf16 vs sdpa bf16 on the GPU at the same
  tolerances (the same bf16 inputs; only the attention kernel differs).
"""

import dataclasses

import pytest
import torch

from tidal.core import get_model
from tidal.models import Llama, VarlenBatch, loss_sum

pytestmark = pytest.mark.cuda

LENS = [37, 5, 120, 64]


# tiny's heads are 8 wide; FlexAttention's compiled CUDA kernel needs >= 16 (models/attention.FLEX_MIN_HEAD_DIM), so
# the kernel comparisons run tiny's shape with 4 query / 2 key-value heads of 16
TINY16 = dataclasses.replace(get_model("tiny"), name="tiny-hd16", heads=4, kv_heads=2)


def _run(device, backend, dtype=torch.float32, spec=TINY16, compile="off"):
    torch.manual_seed(0)
    model = Llama(spec, backend).to(device=device, dtype=dtype)
    model.set_compile(compile)
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(0, 256, (sum(LENS) + 1,), generator=g).to(device)
    batch = VarlenBatch.from_lengths(LENS, device=device)
    loss = loss_sum(model(toks[:-1], batch), toks[1:]) / sum(LENS)
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}


@pytest.fixture
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _close(loss, grads, ref_loss, ref, rtol_loss, rtol_grad):
    assert abs(loss - ref_loss) / abs(ref_loss) < rtol_loss, (loss, ref_loss)
    for n, g in grads.items():
        assert float((g - ref[n]).abs().max() / ref[n].abs().max()) < rtol_grad, n


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_model_on_cuda_matches_cpu_fp32(backend, no_tf32):
    from tidal.models.attention import explain_backend

    assert explain_backend(backend, "cuda", torch.float32, head_dim=TINY16.head_dim)[0] == backend  # no fallback
    ref_loss, ref = _run("cpu", "sdpa")
    loss, grads = _run("cuda", backend)
    _close(loss, grads, ref_loss, ref, 1e-4, 1e-4)


def test_compiled_dense_on_cuda_matches_cpu_fp32(no_tf32):
    """`[model] compile` (decision 140) on CUDA: auto resolves to dense and its start-up probe compiles (Triton);
    the model with RMSNorm and the SwiGLU gate compiled, fp32, against eager CPU fp32 within the fp32 tolerances
    above (a fused reduction only reorders sums)."""
    from tidal.models.dense import choose_compile

    assert choose_compile("auto", torch.device("cuda"), torch.bfloat16, TINY16.hidden) == ("dense", "")
    ref_loss, ref = _run("cpu", "sdpa")
    loss, grads = _run("cuda", "sdpa", compile="dense")
    _close(loss, grads, ref_loss, ref, 1e-4, 1e-4)


def test_mixed_on_cuda_runs_both_kernels_and_matches_cpu(no_tf32):
    """attn_backend "mixed" (decision 119; auto on CUDA since decision 140) on two micro-batches whose
    H200-rule picks differ: 40 documents of 5 tokens (flex, the compiled kernel with its backward) and one of 200
    (sdpa). Loss and gradients of each within the fp32 tolerances above of CPU sdpa; each kernel ran once."""
    from tidal.models.attention import explain_backend

    assert explain_backend("mixed", "cuda", torch.float32, head_dim=TINY16.head_dim)[0] == "mixed"
    torch.manual_seed(0)
    cpu = Llama(TINY16, "sdpa")
    gpu = Llama(TINY16, "mixed")
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.to("cuda")
    g = torch.Generator().manual_seed(1)
    for lengths in ([5] * 40, [200]):
        toks = torch.randint(0, 256, (sum(lengths) + 1,), generator=g)
        out = []
        for model, dev in ((cpu, "cpu"), (gpu, "cuda")):
            model.zero_grad()
            t = toks.to(dev)
            loss = loss_sum(model(t[:-1], VarlenBatch.from_lengths(lengths, device=dev)), t[1:]) / sum(lengths)
            loss.backward()
            out.append((float(loss.detach()), {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}))
        (ref_loss, ref), (loss, grads) = out
        _close(loss, grads, ref_loss, ref, 1e-4, 1e-4)
    assert gpu.attn_picks == {"flex": 1, "sdpa": 1}


def test_flex_falls_back_below_head_dim_16(no_tf32):
    """tiny (head dim 8) asked for flex on CUDA runs sdpa (the compiled kernel refuses it) and still matches."""
    ref_loss, ref = _run("cpu", "sdpa", spec=get_model("tiny"))
    loss, grads = _run("cuda", "flex", spec=get_model("tiny"))
    _close(loss, grads, ref_loss, ref, 1e-4, 1e-4)


def test_flash_in_bf16_matches_fp32_cpu_and_sdpa_bf16():
    from tidal.models.attention import resolve_backend

    q = torch.zeros(1, 1, 16, device="cuda", dtype=torch.bfloat16)
    if resolve_backend("flash", q, needs_grad=True) != "flash":
        pytest.skip("flash_attn is not installed")
    ref_loss, ref = _run("cpu", "sdpa")
    loss, grads = _run("cuda", "flash", torch.bfloat16)
    _close(loss, grads, ref_loss, ref, 1e-3, 1e-1)
    sdpa_loss, sdpa = _run("cuda", "sdpa", torch.bfloat16)
    _close(loss, grads, sdpa_loss, sdpa, 1e-3, 1e-1)


@pytest.mark.parametrize("tf32", [False, True])
def test_executor_on_one_gpu(tf32):
    """One NCCL rank on the GPU trains like the single-process reference (same documents, float32 compute).
    `[train] tf32 = false`: full fp32 matmuls, so kernel order alone differs: 10x `tidal verify`'s float32 loss
    tolerance. TF32 on (the default): matmul inputs rounded to 10 mantissa bits (H200: loss 2.2e-5 off), which is
    finer than bf16's 7, so `tidal verify`'s bfloat16 tolerances bound it. The calibration's measured time is the
    forward and backward's GPU time from CUDA events (decision 141): positive and within the step's wall time."""
    from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.launch import run_distributed
    from tidal.runtime.optim import OptimConfig
    from tidal.runtime.train import prepare, train_worker

    cfg = TrainConfig(model=ModelConfig("tiny", "sdpa"), world=WorldConfig("cpux1"),
                      data=DataConfig("stdlib:defs", 256, 1024, "split", 0),
                      planner=PlannerConfig("tp1", "hydraulis", "adaptive", True),
                      optimizer=OptimConfig(lr=1e-3, warmup_steps=1),
                      train=TrainSection(3, 0, "1f1b", "float32", "float32", "", False, tf32=tf32))
    job = prepare(cfg, 1)
    res = run_distributed(train_worker, 1, job, None, True, backend="nccl", timeout_s=300)[0]
    losses, ref = replay_reference(job, res.rows)
    rep = verify_report(res.rows, losses, res.state, ref)
    assert all(0 < r["measured_s"] <= r["wall_s"] for r in res.rows), [(r["measured_s"], r["wall_s"]) for r in res.rows]
    if tf32:
        tol = VERIFY_TOL["bfloat16"]
        assert rep["loss"] <= tol["loss"] and rep["moments"] <= tol["moments"] and rep["params"] <= tol["params"], rep
    else:
        assert rep["loss"] <= VERIFY_TOL["float32"]["loss"] * 10, rep
        assert rep["moments"] <= VERIFY_TOL["float32"]["moments"], rep


def test_executor_default_is_bf16_on_one_gpu():
    """The default compute dtype (auto) on a CUDA rank is bf16 with fp32 master weights; it trains like the fp32
    single-process reference within `tidal verify`'s bfloat16 tolerances."""
    from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.launch import run_distributed
    from tidal.runtime.optim import OptimConfig
    from tidal.runtime.train import prepare, train_worker

    cfg = TrainConfig(model=ModelConfig("tiny", "auto"), world=WorldConfig("cpux1"),
                      data=DataConfig("stdlib:defs", 256, 1024, "split", 0),
                      planner=PlannerConfig("tp1", "hydraulis", "adaptive", True),
                      optimizer=OptimConfig(lr=1e-3, warmup_steps=1), train=TrainSection(steps=3, progress=False))
    job = prepare(cfg, 1)
    assert job.exec_config.compute_dtype == "auto"
    res = run_distributed(train_worker, 1, job, None, True, backend="nccl", timeout_s=300)[0]
    losses, ref = replay_reference(job, res.rows)
    rep = verify_report(res.rows, losses, res.state, ref)
    tol = VERIFY_TOL["bfloat16"]
    assert rep["loss"] <= tol["loss"] and rep["moments"] <= tol["moments"] and rep["params"] <= tol["params"], rep


def test_recompute_and_offload_on_cuda_keep_gradients(no_tf32):
    """Full / selective recomputation and the pinned-host offload (decision 90) on a GPU: fp64 gradients within
    rtol 1e-12 of the plain GPU run, and the offloaded layers really moved their saved activations to the host."""
    def run(modes, offload):
        torch.manual_seed(0)
        model = Llama(get_model("tiny"), "sdpa").to(device="cuda", dtype=torch.float64)
        model.set_recompute(modes, offload)
        g = torch.Generator().manual_seed(1)
        toks = torch.randint(0, 256, (sum(LENS) + 1,), generator=g).to("cuda")
        batch = VarlenBatch.from_lengths(LENS, device="cuda")
        loss = loss_sum(model(toks[:-1], batch), toks[1:])
        loss.backward()
        return model, float(loss.detach()), {n: p.grad.detach().cpu() for n, p in model.named_parameters()}

    _, ref_loss, ref = run(None, ())
    model, loss, grads = run({0: "full", 1: "selective", 4: "full"}, (1, 2, 4))
    _close(loss, grads, ref_loss, ref, 1e-12, 1e-12)
    assert model.layers["2"].offload.moved > 0 and model.layers["1"].offload.moved > 0


def test_sdpa_on_cuda_runs_no_cudnn_kernel():
    """sdpa on CUDA (decision 133): the per-document calls, forward and backward, go to PyTorch's flash kernel, never to
    cuDNN's (which builds a graph per new document length), even where cuDNN is allowed and would be chosen."""
    from torch.profiler import ProfilerActivity, profile

    from tidal.models.attention import VarlenMeta, varlen_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = [37, 300, 129]
    meta = VarlenMeta.from_lengths(lengths).to("cuda")
    q, k, v = (torch.randn(sum(lengths), 8, 64, device="cuda", dtype=torch.bfloat16, generator=g,
                           requires_grad=True) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        varlen_attention(q, k, v, meta, "sdpa").float().square().sum().backward()
    names = {e.name for e in prof.events()}
    assert not any("cudnn" in n for n in names), sorted(n for n in names if "cudnn" in n)
    assert "aten::_scaled_dot_product_flash_attention" in names
    assert "aten::_scaled_dot_product_flash_attention_backward" in names
