"""Pipeline parallelism: uneven stage splits, 1F1B and GPipe schedules, and an executor for micro-batches of
different lengths.

* :func:`split_stage` deletes the layers (and embedding / final norm / head) a stage does not own; names stay global.
* :func:`schedule_1f1b` / :func:`schedule_gpipe` are pure: ``(micro-batches, pp, stage) -> (("F"|"B", i), ...)``.
* :func:`execute` runs a schedule. Every hidden-state message is preceded by a shape header
  (:func:`tidal.runtime.comm.send_with_shape`), since micro-batch lengths differ. Sends are non-blocking and receives
  blocking, which keeps both schedules deadlock-free. A micro-batch's stage input/output are dropped as soon as its
  backward has run (``retain_graph=False`` also frees the autograd-saved activations). The executor measures the peak
  number of micro-batches whose activations are live and the peak bytes of autograd-saved activations (parameters
  excluded) via ``saved_tensors_hooks``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tidal.core.errors import TidalError
from tidal.runtime.comm import recv_with_shape, send_with_shape

Action = tuple[str, int]


def stage_layer_range(stage_layers: tuple[int, ...], stage: int) -> range:
    if not 0 <= stage < len(stage_layers):
        raise TidalError(f"stage {stage} out of range for {len(stage_layers)} stages")
    start = sum(stage_layers[:stage])
    return range(start, start + stage_layers[stage])


def split_stage(model: nn.Module, stage_layers: tuple[int, ...], stage: int) -> nn.Module:
    """Keep only stage `stage`'s layers of a full Llama (in place). With tied embeddings and more than one stage the
    last stage keeps its own copy of the embedding as the head; the runner sums the two copies' gradients."""
    if sum(stage_layers) != len(model.layers) or min(stage_layers) < 1:
        raise TidalError(f"layer split {stage_layers} must be positive and sum to {len(model.layers)} layers")
    keep = {str(i) for i in stage_layer_range(stage_layers, stage)}
    for name in [n for n in model.layers if n not in keep]:
        del model.layers[name]
    last = stage == len(stage_layers) - 1
    if stage != 0:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


def schedule_gpipe(num_micro: int, pp: int, stage: int) -> tuple[Action, ...]:
    """All forwards, then all backwards. Backwards run in forward order, so every stage accumulates gradients in the
    same order as under 1F1B and the two schedules give bitwise-identical gradients."""
    _check_schedule(num_micro, pp, stage)
    return tuple(("F", i) for i in range(num_micro)) + tuple(("B", i) for i in range(num_micro))


def schedule_1f1b(num_micro: int, pp: int, stage: int) -> tuple[Action, ...]:
    """PipeDream-flush 1F1B: `pp - stage - 1` warm-up forwards, then one forward / one backward, then cool-down.
    A stage never holds more than `pp - stage` micro-batches' activations."""
    _check_schedule(num_micro, pp, stage)
    warm = min(pp - stage - 1, num_micro)
    out: list[Action] = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < num_micro:
        out += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    out += [("B", i) for i in range(b, num_micro)]
    return tuple(out)


SCHEDULES: dict[str, Callable[[int, int, int], tuple[Action, ...]]] = {"1f1b": schedule_1f1b, "gpipe": schedule_gpipe}


def _check_schedule(num_micro: int, pp: int, stage: int) -> None:
    if num_micro < 1 or pp < 1 or not 0 <= stage < pp:
        raise TidalError(f"bad schedule request: {num_micro} micro-batches, pp={pp}, stage={stage}")


@dataclass(frozen=True)
class ExecStats:
    loss_sum: float  # sum of the (already normalised) micro-batch losses computed on this rank; 0 off the last stage
    peak_live_micro_batches: int
    peak_saved_bytes: int
    actions: int
    forward_seconds: tuple[float, ...] = ()  # per micro-batch, wall time of its forward on this stage (incl. receive)
    backward_seconds: tuple[float, ...] = ()  # per micro-batch, wall time of its backward on this stage


class _SavedBytes:
    """Counts bytes of live autograd-saved tensors (parameters excluded) through saved_tensors_hooks."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        # parameters (and views of them, e.g. a transposed weight saved by a matmul) share their storage
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.live, self.peak = 0, 0

    def pack(self, t: torch.Tensor):
        if t.untyped_storage().data_ptr() in self.params:
            return t
        n = t.numel() * t.element_size()
        self.live += n
        self.peak = max(self.peak, self.live)
        holder = _Box([t])
        weakref.finalize(holder, self._release, n)
        return holder

    def _release(self, n: int) -> None:
        self.live -= n

    @staticmethod
    def unpack(x):
        return x.box[0] if isinstance(x, _Box) else x


class _Box:
    __slots__ = ("box", "__weakref__")

    def __init__(self, box: list) -> None:
        self.box = box


def execute(
    actions: tuple[Action, ...],
    stage_forward: Callable[[int, torch.Tensor | None], torch.Tensor],
    stage_loss: Callable[[int, torch.Tensor], torch.Tensor],
    *,
    first: bool,
    last: bool,
    prev_rank: int | None,
    next_rank: int | None,
    dtype: torch.dtype,
    params: list[torch.Tensor],
) -> ExecStats:
    """Run `actions` on one stage. `stage_forward(i, x)` gets None on the first stage (it reads its own tokens) and
    the received hidden states elsewhere; `stage_loss(i, out)` turns the last stage's output into the normalised loss.
    Gradients accumulate into the parameters' `.grad`."""
    counter = _SavedBytes(params)
    device = params[0].device if params else torch.device("cpu")  # received activations live with the parameters
    live: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
    pending: list = []
    peak_live, loss_total = 0, 0.0
    n = 1 + max(i for _, i in actions)
    fwd_s, bwd_s = [0.0] * n, [0.0] * n
    for kind, i in actions:
        t0 = time.perf_counter()
        if kind == "F":
            if i in live:
                raise TidalError(f"micro-batch {i} forwarded twice")
            x = None if first else recv_with_shape(prev_rank, dtype, device).requires_grad_()
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                out = stage_forward(i, x)
                if last:
                    out = stage_loss(i, out)
                    loss_total += float(out.detach())
            if not last:
                works, bufs = send_with_shape(out, next_rank)
                pending.append((works, bufs))
            live[i] = (x, out)
            peak_live = max(peak_live, len(live))
            fwd_s[i] += time.perf_counter() - t0
        elif kind == "B":
            if i not in live:
                raise TidalError(f"backward of micro-batch {i} before its forward")
            x, out = live.pop(i)
            if last:
                out.backward()
            else:
                grad = recv_with_shape(next_rank, dtype, device)
                torch.autograd.backward(out, grad)
            if not first:
                works, bufs = send_with_shape(x.grad, prev_rank)
                pending.append((works, bufs))
            del x, out
            bwd_s[i] += time.perf_counter() - t0
        else:
            raise TidalError(f"unknown pipeline action {kind!r}")
        pending = [p for p in pending if not all(w.is_completed() for w in p[0])]
    for works, _ in pending:
        for w in works:
            w.wait()
    if live:
        raise TidalError(f"schedule left micro-batches {sorted(live)} without a backward")
    return ExecStats(loss_total, peak_live, counter.peak, len(actions), tuple(fwd_s), tuple(bwd_s))
