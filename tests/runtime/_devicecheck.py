"""A device checker for the tests (`device_check`): a TorchFunctionMode that watches every torch call while a forward
and backward run, and records three kinds of findings:

* ``factory``: a tensor factory (arange, zeros, ones, empty, full, tensor, as_tensor, rand*, linspace, eye, ...)
  called from watched code (the tidal package by default) without an explicit ``device=``. Such a tensor lands on
  the default device (the CPU), whatever device the model runs on: the RoPE bug of issue 23. On a CPU run nothing
  fails, which is why the rule is about the *call*, not the outcome;
* ``mixed``: an op whose tensor arguments (0-dim ones excepted, as torch itself allows CPU scalars anywhere) sit on
  different devices, wherever it is called from; explicit moves (``to``, ``copy_``, ``cpu``, ``cuda``) are exempt;
* ``host-read`` (with ``host_reads=True``): ``item``, ``tolist``, ``numpy``, ``cpu`` and the Python conversions
  (``int``, ``float``, ``bool``, ``index``) of a tensor, called from watched code. On CUDA each is a blocking
  device-to-host sync; the model's forward and backward must have none.

Python-level autograd functions' ``backward`` (the TP and CP collectives' custom Functions) runs under the mode
too (torch pops a mode while it handles a call, so the checker runs ``Tensor.backward``/``autograd.backward``'s
engine call itself with the mode pushed), so backward is covered; built-in ops' backward kernels are C++ and create
no tensors from Python.

It lives under tests/ because only tests use it: production code has no use for a checker that slows every call.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import tidal

TIDAL_DIR = os.path.dirname(os.path.abspath(tidal.__file__))
_SKIP = (os.path.join(os.path.dirname(torch.__file__), "overrides.py"),
         os.path.join(os.path.dirname(torch.__file__), "utils", "_device.py"), os.path.abspath(__file__))

FACTORIES = frozenset({
    torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.as_tensor, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.eye, torch.empty_strided,
    torch.scalar_tensor, torch.tril_indices, torch.triu_indices, torch.range,
})
HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"})
# explicit moves between devices (and nn.Module.to_empty's check of a meta parameter against its new storage)
MOVES = frozenset({"to", "copy_", "cpu", "cuda", "pin_memory", "__set__", "__get__", "__setitem__",
                   "_has_compatible_shallow_copy_type"})


@dataclass(frozen=True)
class Finding:
    kind: str  # factory | mixed | host-read
    op: str
    where: str  # file:line in function
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.op} at {self.where}{' (' + self.detail + ')' if self.detail else ''}"


def _name(func) -> str:
    return getattr(func, "__name__", None) or str(func)


class DeviceChecker(TorchFunctionMode):
    """``with DeviceChecker() as dc: ...`` then ``dc.findings``. `watch`: path prefixes (directories or files) whose
    calls the factory and host-read rules apply to; `allow`: ``(file suffix, function name)`` pairs exempt from them
    (with the reason written where the allowance is made)."""

    def __init__(self, watch: Sequence[str] = (TIDAL_DIR,), host_reads: bool = False,
                 allow: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__()
        self.watch = tuple(os.path.abspath(w) for w in watch)
        self.host_reads = host_reads
        self.allow = tuple(allow)
        self.findings: list[Finding] = []

    def _caller(self):
        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename in _SKIP:
            f = f.f_back
        return f

    def _watched(self, f) -> bool:
        if f is None:
            return False
        path = os.path.abspath(f.f_code.co_filename)
        if not any(path == w or path.startswith(w + os.sep) for w in self.watch):
            return False
        return not any(path.endswith(a) and f.f_code.co_name == b for a, b in self.allow)

    @staticmethod
    def _where(f) -> str:
        if f is None:
            return "?"
        path = f.f_code.co_filename
        short = os.path.relpath(path, os.path.dirname(TIDAL_DIR)) if path.startswith(TIDAL_DIR) else \
            os.path.basename(path)
        return f"{short}:{f.f_lineno} in {f.f_code.co_name}"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        f = self._caller()
        if self._watched(f):
            if func in FACTORIES and kwargs.get("device") is None and not (
                    func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)):
                self.findings.append(Finding("factory", name, self._where(f), "no device="))
            if self.host_reads and name in HOST_READS and args and isinstance(args[0], torch.Tensor):
                self.findings.append(Finding("host-read", name, self._where(f), f"tensor on {args[0].device}"))
        if name not in MOVES:
            devs = {t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0}
            if len(devs) > 1:
                self.findings.append(Finding("mixed", name, self._where(f),
                                             " and ".join(sorted(str(d) for d in devs))))
        if name == "backward":  # torch pops the mode while `func` runs: run the engine with the mode pushed again
            with self:
                return _run_backward(func, args, kwargs)
        return func(*args, **kwargs)


def _run_backward(func, args, kwargs) -> None:
    """``Tensor.backward`` / ``torch.autograd.backward`` without their torch-function dispatch (which would hand the
    call back to the mode, popped again): the engine call of torch.autograd.backward."""
    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    a = inspect.signature(func).bind(*args, **kwargs).arguments
    if "self" in a:  # Tensor.backward(self, gradient, retain_graph, create_graph, inputs)
        tensors, grads = (a["self"],), a.get("gradient")
    else:
        t = a["tensors"]
        tensors, grads = ((t,) if isinstance(t, torch.Tensor) else tuple(t)), a.get("grad_tensors")
    inputs = a.get("inputs")
    inputs = () if inputs is None else ((inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs))
    create = bool(a.get("create_graph", False))
    retain = a.get("retain_graph")
    grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grads, len(tensors)), is_grads_batched=False)
    _engine_run_backward(tensors, grads, create if retain is None else retain, create, inputs,
                         allow_unreachable=True, accumulate_grad=True)
