"""Kernel efficiency of one GPU at a model's per-GPU shapes: the analytic cost model's GEMM and attention terms.

The analytic model (costmodel/analytic.py) prices a layer's GEMMs at `gemm * x / (x + gemm_half_flops)` of the
device's peak, x = forward GEMM FLOPs per token of one layer on one GPU (linear_flops_per_token / TP), and attention
at `attn * y / (y + attn_half_width)`, y = hidden / TP. Its constants were fitted on Hydraulis' A800 pools. This
measures both terms on the current device at the TP shards of a model's layer, so that a device type's efficiencies
come from that device (docs/costmodel.md "Hopper"):

- GEMMs: forward + backward (autograd: dgrad and wgrad) of one layer's four linear maps (QKV, output, gate+up, down)
  as the TP shard of each rank holds them, at `--tokens` tokens, for TP in `--tps`; and the vocabulary head.
- Attention: forward + backward of `varlen_attention` on one causal document of each length, heads / TP heads, per
  backend (sdpa and flex where they run).

Each figure is the median of `--repeats` timed runs (CUDA events) after a warm-up. Achieved FLOP/s count 3x the
forward's FLOPs (the model's convention); attention counts l(l+1)/2 pairs. `--out F.json` keeps the rows and the fit.

    python benchmarks/gpu_kernels.py --out kernels.json                 # on a GPU
    python benchmarks/gpu_kernels.py --tokens 256 --tps 1,2 --lengths 256 --repeats 1 --model tiny   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from tidal.core import TidalError, get_cluster
from tidal.models.attention import VarlenMeta, explain_backend, varlen_attention
from tidal.runtime.config import model_arg


def timer(device):
    """(start, stop) -> seconds, by CUDA events on a GPU, by the wall clock elsewhere."""
    if device.type == "cuda":
        def run(fn):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e) / 1e3
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return run


def median_time(fn, device, repeats: int) -> float:
    run = timer(device)
    run(fn)  # warm-up (cuBLAS heuristics, flex compilation)
    return statistics.median(run(fn) for _ in range(repeats))


def gemm_rows(spec, tps, tokens, device, dtype, repeats, peak):
    h, kv, ffn = spec.hidden, spec.kv_dim, spec.ffn
    rows = []
    for t in tps:
        shapes = [(h, (h + 2 * kv) // t), (h // t, h), (h, 2 * ffn // t), (ffn // t, h)]  # (in, out) per rank
        ws = [torch.randn(o, i, device=device, dtype=dtype, requires_grad=True) for i, o in shapes]
        head = torch.randn(spec.vocab // t, h, device=device, dtype=dtype, requires_grad=True)
        for n in tokens:
            xs = [torch.randn(n, i, device=device, dtype=dtype, requires_grad=True) for i, _ in shapes]
            xh = torch.randn(n, h, device=device, dtype=dtype, requires_grad=True)

            def layer(xs=xs, ws=ws):
                for x, w in zip(xs, ws):
                    x.grad = None
                    w.grad = None
                    torch.nn.functional.linear(x, w).sum().backward()

            def head_fn(xh=xh, head=head):
                xh.grad = None
                head.grad = None
                torch.nn.functional.linear(xh, head).sum().backward()

            fwd = 2.0 * sum(i * o for i, o in shapes)  # forward FLOPs per token of one rank's shard
            sec = median_time(layer, device, repeats)
            hsec = median_time(head_fn, device, repeats)
            r = {"tp": t, "tokens": n, "x": fwd, "seconds": sec, "flops": 3 * fwd * n / sec,
                 "head_x": 2.0 * h * spec.vocab / t, "head_seconds": hsec,
                 "head_flops": 3 * 2.0 * h * (spec.vocab // t) * n / hsec}
            rows.append(r)
            print(f"{t:3d} {n:7d} {fwd / 1e6:8.1f} {sec * 1e3:9.3f} {r['flops'] / peak:6.3f} "
                  f"| {hsec * 1e3:8.3f} {r['head_flops'] / peak:6.3f}", flush=True)
            del xs, xh
    return rows


def attn_rows(spec, tps, lengths, device, dtype, repeats, backends, peak):
    rows = []
    hd = spec.head_dim
    for t in tps:
        heads, kvh = spec.heads // t, max(1, spec.kv_heads // t)
        for n in lengths:
            meta = VarlenMeta.from_lengths([n]).to(device)
            q = torch.randn(n, heads, hd, device=device, dtype=dtype, requires_grad=True)
            k = torch.randn(n, kvh, hd, device=device, dtype=dtype, requires_grad=True)
            v = torch.randn(n, kvh, hd, device=device, dtype=dtype, requires_grad=True)
            for b in backends:
                def fn(q=q, k=k, v=v, meta=meta, b=b):
                    for x in (q, k, v):
                        x.grad = None
                    varlen_attention(q, k, v, meta, backend=b).sum().backward()
                try:
                    sec = median_time(fn, device, repeats)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                pairs = n * (n + 1) / 2
                rows.append({"tp": t, "length": n, "backend": b, "width": spec.hidden / t, "seconds": sec,
                             "flops": 3 * 4.0 * (spec.hidden / t) * pairs / sec})
                print(f"{t:3d} {n:7d} {b:>8} {sec * 1e3:9.3f} {rows[-1]['flops'] / peak:6.3f}", flush=True)
            del q, k, v
    return rows


def positive_ints(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; '' -> [] (that part is skipped); anything else is a one-line argparse error."""
    try:
        out = [int(x) for x in text.split(",")] if text.strip() else []
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(x < 1 for x in out):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def fit_saturating(xs, effs):
    """Least squares of eff = a * x / (x + k) over a log grid of k (a closed form for each k)."""
    xs, effs = np.asarray(xs, float), np.asarray(effs, float)
    best = (np.inf, 0.0, 0.0)
    for k in np.geomspace(max(xs.min(), 1.0) * 1e-3, xs.max() * 10, 400):
        f = xs / (xs + k)
        a = float(f @ effs / (f @ f))
        err = float(((a * f - effs) ** 2).sum())
        best = min(best, (err, a, float(k)))
    return best[1], best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--device-type", default="h200", help="the cluster device type whose datasheet peak divides")
    ap.add_argument("--tps", type=positive_ints, default="1,2,4,8")
    ap.add_argument("--tokens", type=positive_ints, default="1024,4096,16384", help="'' skips the GEMM rows")
    ap.add_argument("--lengths", type=positive_ints, default="1024,4096,16384,32768",
                    help="'' skips the attention rows")
    ap.add_argument("--backends", default="sdpa,flex")
    ap.add_argument("--repeats", type=positive_ints, default="5")
    ap.add_argument("--dtype", default="", help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    try:
        spec = model_arg(args.model).spec()
        peak = get_cluster(f"{args.device_type}x1").groups[0].device.peak_flops
    except TidalError as e:
        ap.error(str(e))
    tps, repeats = args.tps, args.repeats[0]
    bad = [t for t in tps if spec.heads % t or spec.kv_heads % t and t % spec.kv_heads or spec.ffn % t]
    if bad:
        ap.error(f"--tps {bad}: must divide {spec.name}'s heads ({spec.heads}) and FFN width ({spec.ffn})")
    hd = spec.head_dim
    backends = [b for b in args.backends.split(",")
                if explain_backend(b, device, dtype, needs_grad=True, head_dim=hd)[0] == b]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{spec.name} on {name} ({dtype}), peak {peak / 1e12:.0f} TFLOP/s ({args.device_type} datasheet), "
          f"median of {repeats}")
    print(f"{'tp':>3} {'tokens':>7} {'x MFLOP':>8} {'layer ms':>9} {'eff':>6} | {'head ms':>8} {'eff':>6}")
    g = gemm_rows(spec, tps, args.tokens, device, dtype, repeats, peak)
    print(f"{'tp':>3} {'length':>7} {'backend':>8} {'ms':>9} {'eff':>6}")
    a = attn_rows(spec, tps, args.lengths, device, dtype, repeats, backends, peak)
    xs = [r["x"] for r in g] + [r["head_x"] for r in g]
    effs = [r["flops"] / peak for r in g] + [r["head_flops"] / peak for r in g]
    fit = {}
    if xs:
        gemm, half = fit_saturating(xs, effs)
        fit = {"gemm": gemm, "gemm_half_flops": half}
        print(f"GEMM fit over every row: gemm {gemm:.3f}, gemm_half_flops {half:.3g}")
    for b in backends:
        sub = [r for r in a if r["backend"] == b and r["length"] >= 4096]
        if sub:
            at, aw = fit_saturating([r["width"] for r in sub], [r["flops"] / peak for r in sub])
            fit[f"attn_{b}"] = {"attn": at, "attn_half_width": aw}
            print(f"attention fit ({b}, lengths >= 4096): attn {at:.3f}, attn_half_width {aw:.0f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": name, "dtype": str(dtype), "peak": peak, "gemm": g, "attention": a, "fit": fit}, f,
                      indent=1)


if __name__ == "__main__":
    main()
