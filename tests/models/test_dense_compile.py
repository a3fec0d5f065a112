"""`[model] compile = "dense"` (models/dense.py, decision 140): each layer's RMSNorm and SwiGLU gate compiled.

Tested here against the eager model on the CPU with Inductor (the code generator users run; it compiles C++ here and
Triton on CUDA): loss and every gradient within rtol 1e-12 / atol 1e-14 in float64 (only the fused kernels' reduction
order differs), with full and selective recomputation and offload too; new document lengths and micro-batch sizes
reuse the compiled graphs (Dynamo's unique-graph count does not grow); bad modes are refused with one line. Training
on gloo ranks against one eager process: tests/runtime/test_dense_compile_train.py."""

import pytest
import torch

from tidal.core import TidalError, get_model
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.models.dense import EAGER, DenseKernels, choose_compile, resolve_compile, rmsnorm, swiglu

pytestmark = pytest.mark.unit
RTOL, ATOL = 1e-12, 1e-14


def _model(compile_mode="off", modes=None, offload=()):
    torch.manual_seed(3)
    m = Llama(get_model("tiny"), "sdpa").to(torch.float64)
    m.set_recompute(modes, offload)
    m.set_compile(compile_mode)
    return m


def _grads(model, lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    x, y = (torch.randint(0, model.spec.vocab, (n,), generator=g) for _ in range(2))
    model.zero_grad(set_to_none=True)
    loss = loss_sum(model(x, VarlenBatch.from_lengths(lengths)), y)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def _close(a, b):
    (la, ga), (lb, gb) = a, b
    torch.testing.assert_close(la, lb, rtol=RTOL, atol=ATOL)
    assert ga.keys() == gb.keys()
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=RTOL, atol=ATOL, msg=lambda m, k=k: f"{k}: {m}")


def test_compiled_dense_matches_eager_and_new_lengths_do_not_recompile():
    eager, comp = _model(), _model("dense")
    assert comp.compile_mode == "dense" and eager.compile_mode == "off"
    norms = [m for m in comp.modules() if type(m).__name__ in ("RMSNorm", "FeedForward")]
    assert len(norms) == 3 * comp.spec.layers + 1 and all(m.dense is comp.dense for m in norms)
    _close(_grads(comp, [37, 5, 21]), _grads(eager, [37, 5, 21]))  # 63 tokens: not the hidden size (64), which
    # duck sizing would tie to it (one more graph for that micro-batch only)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for i, lengths in enumerate(([61], [3, 9, 14, 2, 30], [128, 1])):  # new totals and document counts
        _close(_grads(comp, lengths, seed=i), _grads(eager, lengths, seed=i))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("modes,offload", [("full", ()), ("selective", (1, 4)), ({0: "full", 3: "selective"}, (0,))])
def test_compiled_dense_with_recompute_and_offload(modes, offload):
    lengths = [19, 40, 7]
    _close(_grads(_model("dense", modes, offload), lengths), _grads(_model(), lengths))


def test_the_functions_are_the_eager_layers_and_modes_switch_back():
    x, w = torch.randn(6, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    ref = x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * w
    torch.testing.assert_close(rmsnorm(x, w, 1e-5), ref, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(swiglu(x, 2 * x), torch.nn.functional.silu(x) * 2 * x, rtol=0, atol=0)
    assert DenseKernels() == EAGER and EAGER.mode == "off"
    m = _model("dense")
    m.set_compile("off")
    assert m.dense is EAGER and all(getattr(mod, "dense", EAGER) is EAGER for mod in m.modules())
    with pytest.raises(TidalError, match="unknown compile mode 'auto'; choose off or dense"):
        m.set_compile("auto")  # the runtime resolves auto for its device


def test_auto_is_dense_on_cuda_only():
    assert [resolve_compile("auto", cuda) for cuda in (True, False)] == ["dense", "off"]
    assert [resolve_compile(m, True) for m in ("off", "dense")] == ["off", "dense"]
    with pytest.raises(TidalError, match="unknown compile mode 'all'; choose one of auto, off, dense"):
        resolve_compile("all", False)


def test_the_memory_charge_drops_one_ffn_tensor_when_compiled():
    """The SwiGLU gate compiled saves gate and up, not the SiLU output: one ffn-wide tensor per token per layer fewer
    (on an H200, llama3.2-1b's peak fell 15.2 GiB, 0.89x of the eager charge, decision 140)."""
    from tidal.core import ParallelScheme
    from tidal.costmodel.memory import executor_memory, stage_act_per_token

    spec, scheme = get_model("llama3.2-1b"), ParallelScheme(tp=2)
    eager, dense = (stage_act_per_token(spec, scheme, 0, executor_memory("bfloat16", "float32", compile=c))
                    for c in ("off", "dense"))
    assert eager - dense == pytest.approx(2 * spec.ffn / 2 * spec.layers)


def test_bad_compile_mode_in_config_is_one_line():
    from tidal.runtime.config import ModelConfig, TrainConfig
    from tidal.runtime.train import prepare

    with pytest.raises(TidalError, match=r"^\[model\] compile must be one of auto, off, dense, got 'yes'$"):
        prepare(TrainConfig(model=ModelConfig("tiny", compile="yes")), None)


def _broken(gm, example_inputs):  # a torch.compile backend that cannot compile (no working compiler stack)
    raise RuntimeError("no compiler here")


def test_choose_compile_probes_and_auto_falls_back_to_eager():
    cpu = torch.device("cpu")
    assert choose_compile("auto", cpu, torch.float32, 16) == ("off", "")  # auto on the CPU: eager, nothing compiled
    assert choose_compile("off", cpu, torch.float32, 16, backend=_broken, auto_dense=True) == ("off", "")
    assert choose_compile("dense", cpu, torch.float64, 24, backend="aot_eager") == ("dense", "")
    assert choose_compile("auto", cpu, torch.float64, 24, backend="aot_eager", auto_dense=True) == ("dense", "")
    mode, why = choose_compile("auto", cpu, torch.float32, 16, backend=_broken, auto_dense=True)
    assert (mode, why) == ("off", "auto: dense failed, RuntimeError: no compiler here")
    with pytest.raises(TidalError, match=r'^\[model\] compile = "dense" failed on cpu: RuntimeError: no compiler here '
                                         r'\(set compile = "off"\)$'):
        choose_compile("dense", cpu, torch.float32, 16, backend=_broken)
