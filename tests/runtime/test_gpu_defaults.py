"""GPU defaults (issue 23 item 5) resolved on any machine: compute dtype "auto" is bfloat16 on CUDA with fp32 master
weights, float32 on CPU and float64 under float64 master weights; explicit settings win; bad values are refused with
one line; `tidal profile` profiles the same compute dtype; CUDA ranks turn TF32 on."""

import pytest
import torch

from tidal.core.errors import TidalError
from tidal.runtime.config import TrainSection, compute_dtype_for, config_from_dict, load_config
from tidal.runtime.executor import ExecConfig
from tidal.runtime.launch import cuda_defaults
from tidal.runtime.profiler import profile_dtype

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("compute,master,device,want", [
    ("auto", "float32", "cuda", "bfloat16"),
    ("auto", "float32", "cpu", "float32"),
    ("auto", "float64", "cuda", "float64"),
    ("auto", "float64", "cpu", "float64"),
    ("float32", "float32", "cuda", "float32"),  # explicit settings win
    ("bfloat16", "float32", "cpu", "bfloat16"),
    ("float64", "float64", "cuda", "float64"),
])
def test_compute_dtype_resolution(compute, master, device, want):
    assert compute_dtype_for(compute, master, device) == want
    got = ExecConfig(master_dtype=master, compute_dtype=compute).dtypes(torch.device(device))
    assert got == (getattr(torch, master), getattr(torch, want))


def test_defaults_are_auto_with_fp32_masters():
    assert (TrainSection().compute_dtype, TrainSection().master_dtype) == ("auto", "float32")
    assert (ExecConfig().compute_dtype, ExecConfig().master_dtype) == ("auto", "float32")
    assert ExecConfig().dtypes("cuda") == (torch.float32, torch.bfloat16)
    assert ExecConfig().dtypes("cpu") == (torch.float32, torch.float32)
    assert load_config("examples/train-tiny.toml").train.compute_dtype == "auto"


@pytest.mark.parametrize("key,value,msg", [
    ("compute_dtype", "fp16", "[train] compute_dtype must be one of auto, float32, bfloat16, float64, got 'fp16'"),
    ("master_dtype", "bfloat16", "[train] master_dtype must be one of float32, float64, got 'bfloat16' (bf16"),
    ("master_dtype", "auto", "[train] master_dtype must be one of float32, float64, got 'auto'"),
])
def test_bad_dtypes_are_one_line_errors(key, value, msg):
    with pytest.raises(TidalError) as e:
        config_from_dict({"train": {key: value}})
    assert msg in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TidalError, match=key):
        ExecConfig(**{key: value})


def test_profile_dtype_follows_training():
    assert profile_dtype("auto", "nccl") == "bfloat16"
    assert profile_dtype("auto", "gloo") == "float32"
    assert profile_dtype("float32", "nccl") == "float32"
    with pytest.raises(TidalError, match="profile dtype must be one of auto"):
        profile_dtype("half", "gloo")


def test_cuda_defaults_turn_tf32_on():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        cuda_defaults()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_train_plans_with_the_executors_memory():
    """`tidal train`'s planner charges what the executor holds (decision 72): bf16 parameters and an fp32 gradient
    buffer on a GPU cluster under `auto`, fp32 on a CPU one, fp64 under float64 masters; MaxLen follows."""
    import dataclasses

    from tidal.core import get_cluster, get_model
    from tidal.core.scheme import ParallelScheme
    from tidal.costmodel.analytic import AnalyticCostModel
    from tidal.costmodel.memory import MemoryConfig, executor_memory
    from tidal.runtime.train import build_cost_model, train_memory

    cfg = load_config("examples/train-tiny.toml")
    gpu, cpu = get_cluster("a800x16"), get_cluster("cpux4")
    mem = train_memory(cfg, gpu)
    assert (mem.mode, mem.param_bytes_per_param, mem.grad_bytes_per_param, mem.master_bytes_per_param) == (
        "executor", 2, 4, 12)
    assert train_memory(cfg, cpu).param_bytes_per_param == 4
    f64 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, master_dtype="float64"))
    assert (train_memory(f64, gpu).param_bytes_per_param, train_memory(f64, gpu).master_bytes_per_param) == (8, 24)
    assert build_cost_model(cfg, get_model(cfg.model.name), cpu).memory == train_memory(cfg, cpu)
    # `[model] compile` (decision 140): the compiled layer's smaller activations are charged only where dense is
    # named; auto may fall back to eager at start-up, after planning, so it is charged as eager
    dense = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, compile="dense"))
    assert (cfg.model.compile, train_memory(cfg, gpu).act_ffn_tensors, train_memory(dense, gpu).act_ffn_tensors) == (
        "auto", 4.0, 3.0)
    # the executor's charge is below Hydraulis' App. C.1 one where the fp32 gradient buffer dominates
    spec, dev = get_model("llama2-13b"), gpu.groups[0].device
    honest = AnalyticCostModel(spec, gpu, memory=executor_memory("bfloat16", "float32"))
    assert honest.max_len(ParallelScheme(tp=1), dev) == 0 < AnalyticCostModel(spec, gpu).max_len(
        ParallelScheme(tp=1), dev)
    assert 0 < honest.max_len(ParallelScheme(tp=4), dev) < AnalyticCostModel(spec, gpu, memory=MemoryConfig()).max_len(
        ParallelScheme(tp=4), dev)
    with pytest.raises(TidalError, match="unknown dtype"):
        executor_memory("int8", "float32")
