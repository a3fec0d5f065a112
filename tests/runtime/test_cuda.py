"""The runtime on a CUDA device (skipped without one; run them on a GPU machine: `python -m pytest -m cuda`).

Tolerance: fp32 CUDA vs fp32 CPU differ by kernel order and TF32 (disabled here): rtol 1e-4 on the loss and on
gradients scaled by their tensor's maximum."""

import pytest
import torch

from tidal.core import get_model
from tidal.models import Llama, VarlenBatch, loss_sum

pytestmark = pytest.mark.cuda


def _run(device, backend):
    torch.manual_seed(0)
    model = Llama(get_model("tiny"), backend).to(device)
    g = torch.Generator().manual_seed(1)
    lens = [37, 5, 120, 64]
    toks = torch.randint(0, 256, (sum(lens) + 1,), generator=g)
    loss = loss_sum(model(toks[:-1].to(device), VarlenBatch.from_lengths(lens)), toks[1:].to(device)) / sum(lens)
    loss.backward()
    return float(loss), {n: p.grad.detach().cpu() for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", ["sdpa", "flex", "flash"])
def test_model_on_cuda_matches_cpu(backend):
    torch.backends.cuda.matmul.allow_tf32 = False
    ref_loss, ref = _run("cpu", "sdpa")
    loss, grads = _run("cuda", backend)
    assert abs(loss - ref_loss) / ref_loss < 1e-4
    for n, g in grads.items():
        assert float((g - ref[n]).abs().max() / ref[n].abs().max()) < 1e-4, n


def test_executor_on_one_gpu():
    """One NCCL rank on the GPU trains like the single-process reference (same documents, float32)."""
    from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report
    from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.launch import run_distributed
    from tidal.runtime.optim import OptimConfig
    from tidal.runtime.train import prepare, train_worker

    cfg = TrainConfig(model=ModelConfig("tiny", "sdpa"), world=WorldConfig("cpux1"),
                      data=DataConfig("stdlib:defs", 256, 1024, "split", 0),
                      planner=PlannerConfig("tp1", "hydraulis", "adaptive", True),
                      optimizer=OptimConfig(lr=1e-3, warmup_steps=1),
                      train=TrainSection(3, 0, "1f1b", "float32", "float32", "", False))
    job = prepare(cfg, 1)
    res = run_distributed(train_worker, 1, job, None, True, backend="nccl", timeout_s=300)[0]
    losses, ref = replay_reference(job, res.rows)
    rep = verify_report(res.rows, losses, res.state, ref)
    assert rep["loss"] <= VERIFY_TOL["float32"]["loss"] * 10 and rep["moments"] <= VERIFY_TOL["float32"]["moments"]
