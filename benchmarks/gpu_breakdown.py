"""Where one micro-batch's forward + backward spends its GPU time: `models.Llama` alone, by kernel class.

Builds the model (preset or TOML `[model]`) in the compute dtype on the current device, and for each micro-batch
(`--mbs`: `;`-separated document lists, e.g. `16384;1024x16`) times forward + loss + backward (median of
`--repeats`, after a warm-up), then records one more under `torch.profiler` and sums the device time of its kernels
by class: GEMM, attention, elementwise/normalisation/other. Printed beside the analytic model's terms for the same
micro-batch (GEMMs and head, attention, per-layer constant), so that the gap between the model and a `tidal
profile` row can be placed (docs/costmodel.md "Hopper").

    python benchmarks/gpu_breakdown.py --model examples/model-llama2-7b-4layers.toml --attn-backend sdpa
    python benchmarks/gpu_breakdown.py --model tiny --mbs "256;64x4" --repeats 1      # a CPU smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tidal.core import ParallelScheme, TidalError, get_cluster
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.runtime.config import model_arg

CLASSES = (("attention", ("flash", "fmha", "attention", "flex", "triton_tem")),
           ("gemm", ("gemm", "cutlass", "nvjet", "sm90_xmma", "ampere_", "matmul", "addmm", "aten::mm")))


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def parse_mbs(text: str) -> list[list[int]]:
    """'16384;1024x16' -> [[16384], [1024] * 16]: micro-batches split by ';', documents by ',', 'LxK' = K of L."""
    out = []
    for mb in text.split(";"):
        lens = []
        for part in mb.split(","):
            n, _, k = part.strip().partition("x")
            try:
                lens += [int(n)] * (int(k) if k else 1)
            except ValueError:
                raise argparse.ArgumentTypeError(f"bad micro-batch {mb!r} in {text!r}: expected L or LxK, "
                                                 "comma-separated") from None
        if not lens or min(lens) < 1:
            raise argparse.ArgumentTypeError(f"bad micro-batch {mb!r} in {text!r}: lengths must be >= 1")
        out.append(lens)
    return out


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="examples/model-llama2-7b-4layers.toml")
    ap.add_argument("--mbs", type=parse_mbs, default="16384;4096x4;1024x16;4096;1024")
    ap.add_argument("--attn-backend", default="sdpa")
    ap.add_argument("--device-type", default="h200")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--top", type=positive_int, default=12, help="kernels listed per micro-batch, by device time")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        spec = model_arg(args.model).spec()
        cluster = get_cluster(f"{args.device_type}x1")
    except TidalError as e:
        ap.error(str(e))
    torch.manual_seed(0)
    model = Llama(spec, args.attn_backend).to(device=device, dtype=dtype)
    cm = AnalyticCostModel(spec, cluster)
    dev = cm.cluster.groups[0].device
    e = cm.eff_for(dev)
    F, m = dev.peak_flops, spec
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    print(f"{spec.name}({spec.layers} layers) on {device}, {dtype}, attention {args.attn_backend}")
    for lens in args.mbs:
        text = ",".join(map(str, lens)) if len(set(lens)) > 1 else f"{lens[0]}x{len(lens)}"
        n = sum(lens)
        toks = torch.randint(0, spec.vocab, (n + 1,), device=device)
        batch = VarlenBatch.from_lengths(lens, device=device)

        def step(toks=toks, batch=batch):
            model.zero_grad(set_to_none=True)
            loss_sum(model(toks[:-1], batch), toks[1:]).backward()

        step()
        walls = []
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            walls.append(time.perf_counter() - t0)
        with torch.profiler.profile(activities=activities) as prof:
            step()
            sync()
        by_cls: dict[str, float] = {}
        kern = []
        for ev in prof.key_averages():
            t = getattr(ev, "self_device_time_total", 0.0) if device.type == "cuda" else ev.self_cpu_time_total
            if t <= 0 or (device.type == "cuda" and ev.device_type != torch.autograd.DeviceType.CUDA):
                continue
            by_cls[kernel_class(ev.key)] = by_cls.get(kernel_class(ev.key), 0.0) + t / 1e3
            kern.append((t / 1e3, ev.count, ev.key))
        pairs = sum(x * (x + 1) / 2 for x in lens)
        gemm_ms = (spec.layers * 3 * m.linear_flops_per_token() / (F * e.gemm_eff(m.linear_flops_per_token()))
                   + 3 * 2 * m.hidden * m.vocab / (F * e.gemm_eff(2 * m.hidden * m.vocab))) * n * 1e3
        attn_ms = spec.layers * 3 * m.attn_flops_per_token_pair() * pairs / (F * e.attn_eff(m.hidden)) * 1e3
        total = cm.coeffs(ParallelScheme(1, 1, 1), dev).mb_time(lens) * 1e3
        busy = sum(by_cls.values())
        print(f"\nmicro-batch {text} ({len(lens)} docs, {n} tokens): wall {statistics.median(walls) * 1e3:.1f} ms, "
              f"device busy {busy:.1f} ms | analytic: total {total:.1f}, GEMM+head {gemm_ms:.1f}, "
              f"attention {attn_ms:.1f}, constant {total - gemm_ms - attn_ms:.1f}")
        print("  by class (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_cls.items())))
        for t, cnt, key in sorted(kern, reverse=True)[:args.top]:
            print(f"  {t:8.2f} ms {cnt:5d}x {kernel_class(key):>9}  {key[:90]}")


if __name__ == "__main__":
    main()
