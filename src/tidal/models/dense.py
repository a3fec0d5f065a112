"""The memory-bound elementwise parts of a layer (RMSNorm, SwiGLU's gate), eager or compiled (decision 140).

Decision 116 found a quarter of a 16K-token micro-batch's H200 time in unfused memory-bound kernels; eagerly, RMSNorm
is five kernels forward (upcast, square, mean, rsqrt-multiply, cast-multiply) and SwiGLU's ``silu(gate) * up`` two,
each reading and writing the whole activation. ``torch.compile`` fuses each into one kernel forward and one or two
backward. Only these pure functions are compiled, never a module: the GEMMs, attention (whose per-document loop
runs over host lists) and tensor parallelism's collectives stay eager, so a compiled model issues the same
collectives in the same order as an eager one, and every rank compiles the same graphs. They are compiled with
``dynamic=True``, so new document lengths and micro-batch sizes reuse the graph instead of recompiling (measured on
an H200: 0 recompiles over 8 micro-batches of new lengths, `benchmarks/gpu_compile.py`).

A model holds one :class:`DenseKernels` value (``Llama.dense``), shared by its layers like the attention kernels;
:data:`EAGER` is the default. :meth:`DenseKernels.compiled` makes a new value with its own compiled wrappers (Dynamo
guards a compiled frame on the wrapper that made it, so each model keeps its wrappers alive as long as itself; the
wrappers share Dynamo's graphs, so a second model compiles nothing new).

:func:`choose_compile` is what the runtime runs: the request resolved for the device and, for "dense", both functions
compiled and run once, forward and backward, on a small input before any stage is built. Where that fails (no working
Triton or C++ compiler, a code-generation bug), ``auto`` runs eagerly and says why in the step rows; a named
``dense`` stops with one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tidal.core.errors import TidalError

COMPILE_MODES = ("auto", "off", "dense")  # ModelConfig.compile / ExecConfig.compile; auto: `resolve_compile`


def resolve_compile(mode: str, cuda: bool) -> str:
    """What a compile request runs on a device: "auto" is "dense" on CUDA (decision 140: llama3.2-1b trained 1.12x
    faster on an H200, with 15 GiB less memory) and "off" elsewhere (on the CPU Inductor compiles C++ at start-up, and
    the tests' tiny models gain nothing); "off" and "dense" as named."""
    if mode not in COMPILE_MODES:
        raise TidalError(f"unknown compile mode {mode!r}; choose one of {', '.join(COMPILE_MODES)}")
    return ("dense" if cuda else "off") if mode == "auto" else mode


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (half precisions are upcast for reductions; float64 stays float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, reduced in at least float32, scaled by `weight`."""
    xf = upcast(x)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: silu(gate) * up."""
    return F.silu(gate) * up


@dataclass(frozen=True)
class DenseKernels:
    """The functions a model's RMSNorms and FeedForwards call; `mode` "off" (eager) or "dense" (compiled)."""

    rmsnorm: Callable = rmsnorm
    swiglu: Callable = swiglu
    mode: str = "off"

    @classmethod
    def compiled(cls, backend: str = "inductor") -> DenseKernels:
        """New compiled wrappers of both functions (`backend`: torch.compile's; "aot_eager" runs the traced graphs
        eagerly, for a quick check of the wiring without a code generator)."""
        return cls(torch.compile(rmsnorm, dynamic=True, backend=backend),
                   torch.compile(swiglu, dynamic=True, backend=backend), "dense")


EAGER = DenseKernels()


def probe(kernels: DenseKernels, device: torch.device, dtype: torch.dtype, width: int) -> None:
    """Run both of `kernels`' functions forward and backward once on a [3, width] input on `device` (this compiles
    them when they are compiled, with dynamic shapes: later calls of any token count and width reuse the graphs).
    The input is fixed, so the probe draws from no random generator (a seeded run stays the same run)."""
    x = torch.linspace(-1.0, 1.0, 3 * width, device=device, dtype=dtype).reshape(3, width).requires_grad_()
    w = torch.ones(width, device=device, dtype=dtype, requires_grad=True)
    (kernels.rmsnorm(x, w, 1e-5).float().sum() + kernels.swiglu(x, x).float().sum()).backward()


def choose_compile(mode: str, device: torch.device, dtype: torch.dtype, width: int, backend="inductor",
                   auto_dense: bool | None = None) -> tuple[str, str]:
    """(the mode to run, "" or why `auto` fell back to eager): `mode` resolved for `device` (`auto_dense`: what auto
    means here; default dense on CUDA), and a "dense" choice probed (:func:`probe`, `backend`: torch.compile's). A
    failed probe under auto runs "off"; a named "dense" raises TidalError with the error's first line."""
    run = resolve_compile(mode, device.type == "cuda" if auto_dense is None else auto_dense)
    if run == "off":
        return run, ""
    try:
        probe(DenseKernels.compiled(backend), device, dtype, width)
    except Exception as e:  # any failure of the compiler stack: auto falls back, a named dense stops
        root = e  # Dynamo wraps a backend's error (BackendCompilerFailed): name the error underneath
        while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
            root = inner
        first = (str(root).strip().splitlines() or [""])[0][:160]
        why = f"{type(root).__name__}: {first}" if first else type(root).__name__
        if mode == "dense":
            raise TidalError(f"[model] compile = \"dense\" failed on {device}: {why} (set compile = \"off\")") from e
        return "off", f"auto: dense failed, {why}"
    return run, ""
