"""Pipeline parallelism: uneven stage splits, 1F1B and GPipe schedules, and an executor for micro-batches of
different lengths.

* :func:`split_stage` deletes the layers (and embedding / final norm / head) a stage does not own; names stay global.
* :func:`schedule_1f1b` / :func:`schedule_gpipe` are pure: ``(micro-batches, pp, stage) -> (("F"|"B", i), ...)``.
* :func:`execute` runs a schedule. Before each action it posts, in one ``batch_isend_irecv`` per neighbour, the
  previous action's sends and the receive this action waits on (:func:`exchanges`), on the process group of that
  adjacent stage pair; receive buffers take their shapes from the step plan (micro-batch lengths differ, and no shape
  header travels). Paired this way, no stage waits on a send its neighbour has not matched, which keeps both schedules
  deadlock-free under NCCL's blocking sends (tests/runtime/test_comm_order.py replays the recorded order under NCCL's
  rules). A micro-batch's stage input/output are dropped as soon as its backward has run (``retain_graph=False``
  also frees the autograd-saved activations). The executor measures the peak number of micro-batches whose
  activations are live and the peak bytes of autograd-saved activations (parameters excluded) via
  ``saved_tensors_hooks``. The loss is summed on the device; nothing in the loop syncs with the host.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tidal.core.errors import TidalError

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
    loss_sum: torch.Tensor  # 0-dim float64 on the device: sum of the (normalised) micro-batch losses; 0 off the last
    peak_live_micro_batches: int
    peak_saved_bytes: int
    actions: int
    forward_seconds: tuple[float, ...] = ()  # per micro-batch, wall time of its forward on this stage (incl. receive)
    backward_seconds: tuple[float, ...] = ()  # per micro-batch, wall time of its backward on this stage
    # on CUDA: (start, end) timing events on the compute stream around each action's forward or backward, recorded
    # after its receives were waited on (so waiting on a neighbour is left out); read once the caller has synced
    device_spans: tuple = ()


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


@dataclass(frozen=True)
class Link:
    """A neighbouring stage: its global rank and the process group of the adjacent stage pair (runtime/groups.py
    `stage_pairs`), on which every message between the two travels."""

    rank: int
    group: object


Message = tuple[str, str, int]  # ("send" | "recv", "prev" | "next", micro-batch)


def exchanges(actions: tuple[Action, ...], *, first: bool, last: bool) -> list[tuple[Message, ...]]:
    """The point-to-point messages posted before each action and after the last: ``len(actions) + 1`` entries.
    Entry k holds the sends of action k - 1 (its output to the next stage, its input gradient to the previous one)
    and the receive action k waits on (its input from the previous stage, its output gradient from the next). Those
    to one neighbour form ONE ``batch_isend_irecv`` (Megatron-LM's send_forward_recv_backward /
    send_backward_recv_forward), so two stages never each wait on a send the other has not yet matched."""
    def sends(kind: str, i: int) -> list[Message]:
        if kind == "F":
            return [] if last else [("send", "next", i)]
        return [] if first else [("send", "prev", i)]

    def recvs(kind: str, i: int) -> list[Message]:
        if kind == "F":
            return [] if first else [("recv", "prev", i)]
        return [] if last else [("recv", "next", i)]

    out, prev = [], []
    for kind, i in actions:
        out.append(tuple(prev + recvs(kind, i)))
        prev = sends(kind, i)
    out.append(tuple(prev))
    return out


def execute(
    actions: tuple[Action, ...],
    stage_forward: Callable[[int, torch.Tensor | None], torch.Tensor],
    stage_loss: Callable[[int, torch.Tensor], torch.Tensor],
    *,
    first: bool,
    last: bool,
    prev_link: Link | None,
    next_link: Link | None,
    recv_shapes: Sequence[tuple[int, ...]],
    dtype: torch.dtype,
    params: list[torch.Tensor],
) -> ExecStats:
    """Run `actions` on one stage. `stage_forward(i, x)` gets None on the first stage (it reads its own tokens) and
    the received hidden states elsewhere; `stage_loss(i, out)` turns the last stage's output into the normalised loss.
    `recv_shapes[i]` is micro-batch i's hidden-state shape at this stage's boundaries (the activation received from
    the previous stage and the gradient received from the next one; known from the step plan, so no shape travels).
    Gradients accumulate into the parameters' `.grad`; the loss stays on the device until the caller reads it."""
    counter = _SavedBytes(params)
    device = params[0].device if params else torch.device("cpu")  # received activations live with the parameters
    n = 1 + max(i for _, i in actions)
    if len(recv_shapes) < n:
        raise TidalError(f"the schedule runs {n} micro-batches but {len(recv_shapes)} receive shapes were given")
    links = {"prev": prev_link, "next": next_link}
    if (prev_link is None) != first or (next_link is None) != last:
        raise TidalError("a stage has a previous link unless it is the first, a next link unless it is the last")
    live: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
    outbox: dict[tuple[str, int], torch.Tensor] = {}  # tensors of the sends posted at the next exchange
    peak_live = 0
    loss_total = torch.zeros((), dtype=torch.float64, device=device)
    fwd_s, bwd_s = [0.0] * n, [0.0] * n
    plan = exchanges(actions, first=first, last=last)
    spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    timed = device.type == "cuda"

    def mark() -> torch.cuda.Event | None:
        if not timed:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def exchange(k: int) -> torch.Tensor | None:
        """Post exchange k, one batch per neighbour on that pair's group, and wait for all of it."""
        batches: dict[str, list] = {}
        got = None
        for op, side, i in plan[k]:
            link = links[side]
            if op == "send":
                t = outbox.pop((side, i))
                if tuple(t.shape) != tuple(recv_shapes[i]):
                    raise TidalError(f"micro-batch {i}: sending shape {tuple(t.shape)} but the plan says "
                                     f"{tuple(recv_shapes[i])}")
                batches.setdefault(side, []).append(dist.P2POp(dist.isend, t, link.rank, group=link.group))
            else:
                got = torch.empty(tuple(recv_shapes[i]), dtype=dtype, device=device)
                batches.setdefault(side, []).append(dist.P2POp(dist.irecv, got, link.rank, group=link.group))
        works = [w for side in ("prev", "next") if side in batches for w in dist.batch_isend_irecv(batches[side])]
        for w in works:
            w.wait()
        return got

    for k, (kind, i) in enumerate(actions):
        t0 = time.perf_counter()
        received = exchange(k)
        start = mark()
        if kind == "F":
            if i in live:
                raise TidalError(f"micro-batch {i} forwarded twice")
            x = None if first else received.requires_grad_()
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                out = stage_forward(i, x)
                if last:
                    out = stage_loss(i, out)
                    loss_total += out.detach().to(torch.float64)
            if not last:
                outbox[("next", i)] = out.detach().contiguous()
            live[i] = (x, out)
            peak_live = max(peak_live, len(live))
            if timed:
                spans.append((start, mark()))
            fwd_s[i] += time.perf_counter() - t0
        elif kind == "B":
            if i not in live:
                raise TidalError(f"backward of micro-batch {i} before its forward")
            x, out = live.pop(i)
            if last:
                out.backward()
            else:
                torch.autograd.backward(out, received)
            if not first:
                outbox[("prev", i)] = (x.grad if x.grad is not None else torch.zeros_like(x)).contiguous()
            del x, out
            if timed:
                spans.append((start, mark()))
            bwd_s[i] += time.perf_counter() - t0
        else:
            raise TidalError(f"unknown pipeline action {kind!r}")
    exchange(len(actions))
    if live:
        raise TidalError(f"schedule left micro-batches {sorted(live)} without a backward")
    return ExecStats(loss_total, peak_live, counter.peak, len(actions), tuple(fwd_s), tuple(bwd_s), tuple(spans))
