"""Forward + backward time of one attention call per backend, at 4K, 16K and 32K packed tokens.

Runs on the current device (CUDA when available, else CPU). Per total length, three document mixes are timed: one
document, 8 equal documents, and a long-tailed (lognormal) mix; the figure is the median over `--repeats` of
forward + backward of `varlen_attention` alone (llama2-7b head shape by default: 32 query heads, 32 key/value heads,
head dim 128, the compute dtype given). Backends that cannot run here are listed with the reason; a cell that
runs out of device memory prints OOM (the reference's [H, L, L] scores: 64 GiB at 32K tokens in one document). CPU time
(`time.thread_time`) is printed beside wall time on CPU, where the measurement shares cores.

    python benchmarks/attention_backends.py                       # every backend that runs here
    python benchmarks/attention_backends.py --tokens 4096 --heads 8 --kv-heads 8 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from tidal.models.attention import FALLBACK, VarlenMeta, explain_backend, varlen_attention


def mixes(total: int, seed: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, 1.2, size=16)
    tail = np.maximum(1, np.floor(raw / raw.sum() * total)).astype(int)
    tail[0] += total - int(tail.sum())
    return {"1 doc": [total], "8 docs": [total // 8] * 8, "long tail": [int(x) for x in tail if x > 0]}


def time_once(backend, q, k, v, meta, device) -> tuple[float, float]:
    for t in (q, k, v):
        t.grad = None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    w0, c0 = time.perf_counter(), time.thread_time()
    out = varlen_attention(q, k, v, meta, backend=backend)
    out.float().square().sum().backward()
    sync()
    return time.perf_counter() - w0, time.thread_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="4096,16384,32768")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="", help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    ap.add_argument("--backends", default=",".join(FALLBACK))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}), dtype "
          f"{str(dtype).replace('torch.', '')}, heads {args.heads}/{args.kv_heads}x{args.head_dim}, "
          f"median of {args.repeats}")
    runnable = []
    for b in args.backends.split(","):
        chosen, skipped = explain_backend(b, device, dtype, needs_grad=True, head_dim=args.head_dim)
        if chosen == b:
            runnable.append(b)
        else:
            print(f"  {b}: skipped ({dict(skipped).get(b, 'falls back to ' + chosen)})")
    print(f"  auto picks: {explain_backend('auto', device, dtype, needs_grad=True, head_dim=args.head_dim)[0]}")
    print(f"{'tokens':>7} {'mix':>10} {'docs':>5} " + " ".join(f"{b + ' ms':>12} {b + ' cpu ms':>13}"
                                                             for b in runnable))
    g = torch.Generator().manual_seed(args.seed)
    for total in (int(x) for x in args.tokens.split(",")):
        for name, lens in mixes(total, args.seed).items():
            meta = VarlenMeta.from_lengths(lens).to(device)
            q = torch.randn(total, args.heads, args.head_dim, generator=g).to(device, dtype).requires_grad_()
            k = torch.randn(total, args.kv_heads, args.head_dim, generator=g).to(device, dtype).requires_grad_()
            v = torch.randn(total, args.kv_heads, args.head_dim, generator=g).to(device, dtype).requires_grad_()
            cells = []
            for b in runnable:
                if b == "reference" and max(lens) > 8192 and device.type == "cpu":
                    cells.append(f"{'-':>12} {'-':>13}")  # [L, L] fp32 scores per head: too slow to be useful
                    continue
                try:
                    time_once(b, q, k, v, meta, device)  # warm-up (and compile, for flex on CUDA)
                    runs = [time_once(b, q, k, v, meta, device) for _ in range(args.repeats)]
                except torch.OutOfMemoryError:  # the reference's [H, L, L] scores at 32K: say so, go on
                    for t in (q, k, v):
                        t.grad = None
                    torch.cuda.empty_cache()
                    cells.append(f"{'OOM':>12} {'-':>13}")
                    continue
                w = statistics.median(r[0] for r in runs) * 1e3
                c = statistics.median(r[1] for r in runs) * 1e3
                cells.append(f"{w:12.1f} {c:13.1f}")
            print(f"{total:7d} {name:>10} {len(lens):5d} " + " ".join(cells))


if __name__ == "__main__":
    main()
