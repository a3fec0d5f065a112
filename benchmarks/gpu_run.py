"""One-device training run: tokens/s, MFU and peak memory against the memory model (docs/runtime.md, "On a GPU").

Trains `--model` for `--steps` steps on one rank with `tidal train`'s own worker (NCCL on a CUDA machine, gloo on
the CPU) and prints, per step and as medians over the steps after `--skip` warm-up steps:

* tokens/s (the step's tokens over its wall time);
* MFU: model FLOPs per step over wall time and the device's dense 16-bit peak (`core.cluster.DEVICE_TYPES`). Model
  FLOPs count forward + backward as 3x forward: every GEMM of the layers and the output head, 2 FLOPs per
  multiply-add, plus attention's QK^T and PV over each sequence's causal (query, key) pairs (the row's
  `model_flops`, costmodel/flops.py); no recomputation is counted;
* peak memory: ``torch.cuda.max_memory_allocated`` (and reserved) on CUDA, against the memory model's peak for the
  largest micro-batch any step ran (`costmodel.memory.stage_memory`, executor mode, the run's dtypes).

    python benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 12      # on a GPU machine
    python benchmarks/gpu_run.py --model tiny --cluster cpux1 --steps 4              # the same path on the CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from tidal.core import ParallelScheme, get_cluster
from tidal.costmodel.memory import executor_memory, stage_memory
from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.train import prepare, train_worker


def bench_worker(rank: int, world: int, job) -> tuple[list[dict], dict]:
    """`train_worker` with the device's peak memory read after the run (rank 0's rows)."""
    cuda = torch.cuda.is_available() and torch.distributed.get_backend() == "nccl"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    res = train_worker(rank, world, job)
    info = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
    if cuda:
        info.update(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved(),
                    total=torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return res.rows, info


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3.2-1b")
    ap.add_argument("--cluster", default="h200x1", help="TYPEx1: its device type gives the peak FLOP/s")
    ap.add_argument("--data", default="random:synthetic:commoncrawl")
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the medians")
    ap.add_argument("--attn-backend", default="auto")
    ap.add_argument("--compile", default="auto", help="[model] compile: auto | off | dense (models/dense.py)")
    ap.add_argument("--compute-dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--cost-model", default="", help='[train] cost_model: "" (analytic) | analytic-eager | a fit')
    ap.add_argument("--out", default="", help="write rows and summary as JSON here")
    args = ap.parse_args(argv)
    cluster = get_cluster(args.cluster)
    if cluster.num_devices != 1:
        print(f"gpu_run: one device only, got {args.cluster}", file=sys.stderr)
        return 2
    cfg = TrainConfig(model=ModelConfig(args.model, args.attn_backend, compile=args.compile),
                      world=WorldConfig(args.cluster),
                      data=DataConfig(args.data, args.max_len, args.tokens_per_step, "split", 0),
                      planner=PlannerConfig("tp1", "hydraulis", "adaptive", True, args.cost_model),
                      optimizer=OptimConfig(lr=1e-4, warmup_steps=2),
                      train=TrainSection(steps=args.steps, compute_dtype=args.compute_dtype, progress=False))
    job = prepare(cfg, 1)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    t0 = time.perf_counter()
    rows, info = run_distributed(bench_worker, 1, job, backend=backend, timeout_s=1200)[0]
    total_s = time.perf_counter() - t0
    spec, dev = job.spec, cluster.groups[0].device
    compute = "bfloat16" if (args.compute_dtype == "auto" and backend == "nccl") else (
        "float32" if args.compute_dtype == "auto" else args.compute_dtype)
    print(f"{args.model} ({spec.num_params() / 1e9:.2f}B params) on {info['device']}, {backend}, compute {compute}, "
          f"peak {dev.peak_flops / 1e12:.0f} TFLOP/s ({dev.name}); run {total_s:.1f} s with start-up")
    print(f"{'step':>4} {'tokens':>7} {'docs':>5} {'wall s':>7} {'tokens/s':>9} {'TFLOP/s':>8} {'MFU':>6} {'loss':>8}")
    kept = []
    for i, r in enumerate(rows):
        tf = r["model_flops"] / r["wall_s"]
        mfu = tf / dev.peak_flops
        print(f"{r['step']:>4} {r['tokens']:>7} {r['documents']:>5} {r['wall_s']:>7.3f} {r['tokens_per_s']:>9.0f} "
              f"{tf / 1e12:>8.1f} {mfu:>6.1%} {r['loss']:>8.4f}")
        if i >= args.skip:
            kept.append((r["tokens_per_s"], mfu))
    summary: dict = {"model": args.model, "device": info["device"], "backend": backend, "compute": compute,
                     "attn_backend": args.attn_backend, "compile": args.compile,
                     "steps": len(rows), "skip": args.skip}
    if kept:
        tps, mfus = [k[0] for k in kept], [k[1] for k in kept]
        summary.update(tokens_per_s_median=statistics.median(tps), tokens_per_s_p10=pct(tps, 0.1),
                       mfu_median=statistics.median(mfus), mfu_worst=min(mfus))
        print(f"steps {args.skip + 1}..{len(rows)}: tokens/s median {summary['tokens_per_s_median']:.0f} "
              f"(p10 {summary['tokens_per_s_p10']:.0f}); MFU median {summary['mfu_median']:.1%}, "
              f"worst {summary['mfu_worst']:.1%}")
    calib = [(r["predicted_s"] / r["measured_s"], r["measured_s"] / r["wall_s"]) for r in rows[args.skip:]
             if r.get("measured_s")]
    if calib:  # decision 141: on CUDA measured_s is the forward and backward's GPU time (CUDA events)
        ratios, shares = sorted(c[0] for c in calib), sorted(c[1] for c in calib)
        summary.update(cost_model=args.cost_model or "analytic", predicted_over_measured=ratios,
                       measured_over_wall=shares)
        print(f"cost model {args.cost_model or 'analytic'}: predicted / measured compute median "
              f"{statistics.median(ratios):.3f} (min {ratios[0]:.3f}, max {ratios[-1]:.3f}); measured / wall median "
              f"{statistics.median(shares):.3f} (max {shares[-1]:.3f})")
    picks: dict[str, int] = {}
    for r in rows:
        for b, n in r.get("attn_picks", {}).items():
            picks[b] = picks.get(b, 0) + n
    if picks:
        summary["attn_picks"] = picks
        print("attention backend per micro-batch (all steps): "
              + ", ".join(f"{b} {n}" for b, n in sorted(picks.items())))
    biggest = max((r["max_mb_tokens"] for r in rows), default=0)
    model_peak = max(stage_memory(spec, ParallelScheme(), 1, biggest,
                                  executor_memory(compute, "float32",
                                                  compile=args.compile if args.compile == "dense" else "off")))
    summary.update(max_mb_tokens=biggest, model_peak_bytes=model_peak)
    if "peak_allocated" in info:
        summary.update(peak_allocated=info["peak_allocated"], peak_reserved=info["peak_reserved"],
                       device_total=info["total"])
        print(f"peak memory: allocated {info['peak_allocated'] / 2**30:.2f} GiB, reserved "
              f"{info['peak_reserved'] / 2**30:.2f} GiB of {info['total'] / 2**30:.1f} GiB; memory model "
              f"{model_peak / 2**30:.2f} GiB for the largest micro-batch ({biggest} tokens): measured/model "
              f"{info['peak_allocated'] / model_peak:.2f}")
    else:
        print(f"memory model peak for the largest micro-batch ({biggest} tokens): {model_peak / 2**30:.3f} GiB "
              "(no CUDA: device memory not measured; benchmarks/resident_memory.py measures CPU storages)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
