"""Would `torch.compile` of a layer's dense parts pay in training? Eager against compiled, on repeated and new shapes.

Decision 116 found a quarter of a 16K-token micro-batch's H200 time in unfused memory-bound kernels (RMSNorm, SwiGLU's
gate, residuals, casts) and small micro-batches waiting on the host; decision 133 found that a kernel which is fast on
repeated shapes (cuDNN attention) can lose in training, where document lengths are new in every micro-batch. So this
times forward + loss + backward of `models.Llama` two ways, in the compute dtype on the current device:
* `eager`: the model as the runtime runs it;
* `compiled`: every layer's FeedForward (gate and up as two GEMMs) and both RMSNorms compiled with
  ``torch.compile(dynamic=True)`` (attention
  stays as the backend runs it: its per-document loop over host lists would specialise a graph per length list);
and for each, (1) the `--mbs` micro-batches repeated (median of `--repeats` after one warm-up call), (2) `--fresh`
micro-batches of new random lengths (a long-tailed draw, `--fresh-tokens` tokens each, every call a new list), timed
call by call after the repeated ones: median and worst, and dynamo's recompiles over them. Nothing here changes the
runtime; it says whether compiling the dense parts is worth building.

    python benchmarks/gpu_compile.py --model llama3.2-1b                          # on a GPU machine
    python benchmarks/gpu_compile.py --model tiny --mbs "256;64x4" --fresh 3 --fresh-tokens 512 --repeats 1 \\
        --compile-backend eager                                                    # the same path on the CPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gpu_breakdown import parse_mbs, positive_int

from tidal.core import TidalError
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.runtime.config import model_arg


def fresh_lengths(rng: np.random.Generator, tokens: int) -> list[int]:
    """Long-tailed document lengths (lognormal, median 1/16 of the micro-batch) summing to `tokens`."""
    out: list[int] = []
    while sum(out) < tokens:
        out.append(int(min(tokens - sum(out), max(1, rng.lognormal(np.log(tokens / 16), 1.2)))))
    return out


def compile_dense(model: Llama, backend: str) -> None:
    """Compile each layer's FeedForward and RMSNorms. The FeedForward runs its gate and up projections as two plain
    linears here: the fused one's storage check (`models.llama._fused_view`) breaks dynamo's graph, and on torch
    2.11 inductor's code for the resumed graph failed on an H200 (NameError on a shape symbol, 2026-11-27)."""
    for layer in model.layers.values():
        layer.feed_forward.fused = False
        for name in ("feed_forward", "attention_norm", "ffn_norm"):
            getattr(layer, name).compile(dynamic=True, backend=backend)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3.2-1b")
    ap.add_argument("--mbs", type=parse_mbs, default="16384;4096x4;1024x16;1024")
    ap.add_argument("--fresh", type=int, default=8, help="micro-batches of new random lengths (0: none)")
    ap.add_argument("--fresh-tokens", type=positive_int, default=16384)
    ap.add_argument("--attn-backend", default="auto")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend (eager: a quick CPU check)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.fresh < 0:
        ap.error(f"--fresh must be >= 0, got {args.fresh}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        spec = model_arg(args.model).spec()
    except TidalError as e:
        ap.error(str(e))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(args.seed)
    state = Llama(spec, args.attn_backend).state_dict()
    rng = np.random.default_rng(args.seed)
    fresh = [fresh_lengths(rng, args.fresh_tokens) for _ in range(args.fresh)]
    print(f"{spec.name} ({spec.layers} layers) on {device}, {dtype}, attention {args.attn_backend}, "
          f"compile backend {args.compile_backend}")
    for mode in ("eager", "compiled"):
        model = Llama(spec, args.attn_backend)
        model.load_state_dict(state)
        model = model.to(device=device, dtype=dtype)
        if mode == "compiled":
            torch._dynamo.reset()
            compile_dense(model, args.compile_backend)

        def step(lens: list[int], model=model) -> float:
            toks = torch.randint(0, spec.vocab, (sum(lens) + 1,), device=device)
            batch = VarlenBatch.from_lengths(lens, device=device)
            sync()
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss_sum(model(toks[:-1], batch), toks[1:]).backward()
            sync()
            return time.perf_counter() - t0

        for lens in args.mbs:
            first = step(lens)
            walls = [step(lens) for _ in range(args.repeats)]
            text = ",".join(map(str, lens)) if len(set(lens)) > 1 else f"{lens[0]}x{len(lens)}"
            print(f"  {mode:<8} repeated {text:<16} first call {first * 1e3:9.1f} ms, then median "
                  f"{statistics.median(walls) * 1e3:8.1f} ms")
        if fresh:
            before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            walls = [step(lens) for lens in fresh]
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
            print(f"  {mode:<8} fresh: {len(fresh)} micro-batches of {args.fresh_tokens} tokens "
                  f"({statistics.median([len(x) for x in fresh]):.0f} documents median): median "
                  f"{statistics.median(walls) * 1e3:.1f} ms, worst {max(walls) * 1e3:.1f} ms, graphs compiled "
                  f"meanwhile {graphs}")


if __name__ == "__main__":
    main()
