"""Saved-activation bytes per pipeline stage with and without activation recomputation (measured through
saved_tensors_hooks, not modelled), and the extra compute it costs (CPU time, one thread), beside what the memory
model (costmodel/memory.py) and the cost model (costmodel/recompute.py) predict. Decision 90.

One process, one thread, the model split into `--pp` stages as the runtime splits it (runtime/pp.split_stage); each
stage runs one micro-batch of one document of each length: forward with the counter installed, then backward.

* measured bytes: distinct storages autograd saved during the stage's forward (parameters excluded; a tensor saved by
  several layers, e.g. RoPE's cos/sin, counted once), at the end of the forward: what the stage holds per in-flight
  micro-batch, the loss's saves included (as runtime/pp.execute counts them). A full recompute's layer inputs are
  saved by the checkpoint (they are counted).
* model bytes: `stage_act_per_token` per micro-batch (PP = 1 in-flight) x tokens, with the memory model's 16-bit
  figures scaled to the run's dtype (x dtype bytes / 2; the fp32 logsumexp term as it is); of the last stage's
  8 vocab B/token (fp32 log-softmax and its gradient) the saved half, 4 vocab. The model assumes a
  flash-style kernel (nothing quadratic in the length); the CPU sdpa kernel is not one, so the measured "none" grows
  faster than the model at long lengths, and what "selective" frees is that kernel's saves.
* extra time: median of `--reps` forward + backward CPU times (time.thread_time, one thread) of the stage, against
  "none"; the cost model's figure is RecomputeCostModel's extra time over the base model's for one micro-batch of
  that length on the analytic model's CPU device (its a, b, c: a model, not a CPU measurement).

CPU timings are noisy on a shared machine: read the time column as a rough figure. GPU: not measured (no GPU here).

    python benchmarks/recompute.py [--model tiny] [--pp 2] [--lengths 256,1024,2048] [--dtype float32]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from tidal.core import get_cluster, get_model
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import default_cost_model
from tidal.costmodel.memory import MemoryConfig, stage_act_per_token
from tidal.costmodel.recompute import RecomputeCostModel
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.runtime.pp import split_stage

MODES = ("none", "selective", "full")


class DistinctSaved:
    """Bytes of distinct storages saved by autograd while installed (parameters excluded)."""

    def __init__(self, params) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.params:
            self.seen[ptr] = max(self.seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def stage_model(spec, pp: int, stage: int, mode: str, dtype: torch.dtype, backend: str) -> Llama:
    torch.manual_seed(0)
    model = Llama(spec, backend)
    split_stage(model, ParallelScheme(1, pp, 1).stage_layers(spec.layers), stage)
    model = model.to(dtype)
    model.set_recompute(mode)
    return model


def run_stage(model: Llama, length: int, first: bool, last: bool, dtype: torch.dtype, count: bool):
    """(saved bytes, CPU seconds of forward + backward) of one micro-batch of one `length`-token document."""
    g = torch.Generator().manual_seed(length)
    batch = VarlenBatch.from_lengths([length])
    x = (torch.randint(0, model.spec.vocab, (length,), generator=g) if first
         else torch.randn(length, model.spec.hidden, generator=g, dtype=dtype).requires_grad_())
    counter = DistinctSaved(model.parameters())
    c0 = time.thread_time()
    labels = torch.randint(0, model.spec.vocab, (length,), generator=g)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack) if count else _null():
        out = model(x, batch)  # the loss inside the counter, as runtime/pp.execute counts it
        if last:
            out = loss_sum(out, labels)
    if last:
        out.backward()
    else:
        out.backward(torch.ones_like(out))
    return counter.total, time.thread_time() - c0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def model_bytes(spec, pp: int, stage: int, mode: str, length: int, itemsize: int) -> float:
    """The memory model's bytes of one in-flight micro-batch on `stage`, in the run's dtype."""
    scale = itemsize / 2.0
    base = MemoryConfig()
    cfg = dataclasses.replace(base, act_bytes_per_token_layer=base.act_bytes_per_token_layer * scale,
                              act_bytes_tp_replicated=base.act_bytes_tp_replicated * scale,
                              recompute_input_bytes=base.recompute_input_bytes * scale, recompute=mode)
    scheme = ParallelScheme(1, pp, 1)
    per_tok = stage_act_per_token(spec, scheme, stage, cfg)
    # stage_act_per_token charges pp in-flight micro-batches and the full-recompute layer live again in the
    # backward; one micro-batch at the end of its forward holds 1/pp of the first and none of the second
    kept_layers = (per_tok - (8.0 * spec.vocab if stage == pp - 1 else 0.0))
    if mode == "full":
        kept_layers -= (base.act_bytes_per_token_layer + base.act_bytes_tp_replicated) * scale * spec.hidden
    # the last stage's 8 * vocab B/token are the fp32 log-softmax (saved) and its gradient (backward only): the saved
    # half here
    return length * (kept_layers / pp + (4.0 * spec.vocab if stage == pp - 1 else 0.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--lengths", default="256,1024,2048")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec, dtype = get_model(args.model), getattr(torch, args.dtype)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    lengths = [int(x) for x in args.lengths.split(",")]
    cm = default_cost_model(spec, get_cluster("cpux8"))
    dev = cm.cluster.groups[0].device
    scheme = ParallelScheme(1, args.pp, 1)
    print(f"model {spec.name}, PP {args.pp} (layers {scheme.stage_layers(spec.layers)}), {args.dtype}, attention "
          f"{args.backend}, one thread, {args.reps} reps (median CPU time); one micro-batch of one document")
    print(f"{'stage':>5} {'len':>6} {'mode':>9} | {'saved MB':>9} {'model MB':>9} {'vs none':>8} {'model':>7} | "
          f"{'f+b ms':>8} {'extra':>7} {'model':>7}")
    for stage in range(args.pp):
        first, last = stage == 0, stage == args.pp - 1
        models = {m: stage_model(spec, args.pp, stage, m, dtype, args.backend) for m in MODES}
        for length in lengths:
            base_t = cm.coeffs(scheme, dev).mb_time([length])
            rows = {}
            for m in MODES:
                saved, _ = run_stage(models[m], length, first, last, dtype, True)
                run_stage(models[m], length, first, last, dtype, False)  # warm-up
                times = [run_stage(models[m], length, first, last, dtype, False)[1] for _ in range(args.reps)]
                pred_t = RecomputeCostModel(cm, m).coeffs(scheme, dev).mb_time([length])
                rows[m] = (saved, model_bytes(spec, args.pp, stage, m, length, itemsize),
                           statistics.median(times), pred_t / base_t - 1.0)
            for m in MODES:
                saved, pred, t, pred_extra = rows[m]
                print(f"{stage:>5} {length:>6} {m:>9} | {saved / 1e6:>9.3f} {pred / 1e6:>9.3f} "
                      f"{saved / rows['none'][0]:>8.3f} {pred / rows['none'][1]:>7.3f} | {t * 1e3:>8.2f} "
                      f"{t / rows['none'][2] - 1:>+7.1%} {pred_extra:>+7.1%}")


if __name__ == "__main__":
    main()
