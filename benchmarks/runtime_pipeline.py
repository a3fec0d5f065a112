"""Per-micro-batch forward/backward time of the real runtime on this CPU, against total length and sum of l^2.

Each scheme runs one pipeline (spawned gloo ranks for TP/CP/PP > 1) over a fixed set of packed micro-batches whose
compositions vary the attention work (sum l^2) at equal token count: one document, a few equal documents, many short
documents, a long-tailed mix. Every micro-batch is timed `--repeats` times after a warm-up step; the reported time is
the median over repeats of the slowest rank's forward + backward (for PP > 1: the sum over stages of each stage's
slowest rank, which includes waiting on receives). These are the points a cost-model fit uses.

    python benchmarks/runtime_pipeline.py                      # tiny model, schemes tp1,tp2,cp2
    python benchmarks/runtime_pipeline.py --schemes tp1,cp2 --attn-backend reference --out runtime_points.csv

`--out` appends rows of the profile format in docs/costmodel.md (`scheme,lengths,seconds`, seconds = forward +
backward; a new file gets the header). Fit only PP = 1 rows: PP > 1 stage times include waiting on other stages.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

import numpy as np
import torch

from tidal.core import PipelinePlan, TidalError, get_model, parse_scheme
from tidal.core.strategy import Pipeline
from tidal.models.attention import BACKENDS
from tidal.runtime.launch import run_distributed
from tidal.runtime.pipeline import GroupCache, RankGrid, build_stage_model, run_pipeline


def micro_batches(totals: list[int], seed: int) -> list[list[int]]:
    """Document-length compositions per total length: 1 doc, 4 equal, 32 equal, long-tailed (lognormal)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in totals:
        out.append([t])
        out.append([t // 4] * 4)
        out.append([t // 32] * 32)
        raw = rng.lognormal(mean=0.0, sigma=1.2, size=12)
        lens = np.maximum(1, np.floor(raw / raw.sum() * t)).astype(int)
        lens[0] += t - lens.sum()
        out.append(sorted(lens.tolist(), reverse=True))
    return out


def _worker(rank: int, world: int, model_name: str, scheme_text: str, mbs: list[list[int]], repeats: int,
            cp_mode: str, threads: int, backend: str) -> list[tuple[int, float, float]]:
    torch.set_num_threads(threads)
    spec = get_model(model_name)
    scheme = parse_scheme(scheme_text)
    pipeline = Pipeline(scheme, tuple(range(world)))
    groups = GroupCache().create_all([pipeline])
    grid = RankGrid.build(pipeline, rank, groups)
    model = build_stage_model(spec, grid, seed=0, attn_backend=backend)
    lengths = [n for mb in mbs for n in mb]
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, spec.vocab, (n + 1,), generator=g) for n in lengths]
    idx, k = [], 0
    for mb in mbs:
        idx.append(tuple(range(k, k + len(mb))))
        k += len(mb)
    plan = PipelinePlan(scheme.tp, scheme.pp, scheme.cp, pipeline.devices, max(lengths), tuple(idx), 0.0,
                        (cp_mode,) * len(idx) if scheme.cp > 1 else (), scheme.layer_split)
    fwd: list[list[float]] = [[] for _ in mbs]
    bwd: list[list[float]] = [[] for _ in mbs]
    for rep in range(repeats + 1):  # first pass is warm-up
        model.zero_grad(set_to_none=True)
        res = run_pipeline(model, grid, plan, lengths, docs, schedule="gpipe")
        if rep:
            for i in range(len(mbs)):
                fwd[i].append(res.forward_seconds[i])
                bwd[i].append(res.backward_seconds[i])
    return [(grid.stage, statistics.median(f), statistics.median(b)) for f, b in zip(fwd, bwd)]


def run_scheme(model: str, scheme_text: str, mbs, repeats: int, cp_mode: str,
               backend: str = "auto") -> list[tuple[float, float]]:
    """(forward, backward) seconds per micro-batch: slowest rank of each stage, summed over stages. A world of one
    also goes through torch.distributed, so every scheme runs the same code path."""
    world = parse_scheme(scheme_text).num_devices
    threads = max(1, 2 // world)  # this machine has 2 cores
    per_rank = run_distributed(_worker, world, model, scheme_text, mbs, repeats, cp_mode, threads, backend,
                               timeout_s=1800)
    out = []
    for i in range(len(mbs)):
        f_stage: dict[int, float] = {}
        b_stage: dict[int, float] = {}
        for r in per_rank:
            stage, f, b = r[i]
            f_stage[stage] = max(f_stage.get(stage, 0.0), f)
            b_stage[stage] = max(b_stage.get(stage, 0.0), b)
        out.append((sum(f_stage.values()), sum(b_stage.values())))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--schemes", default="tp1,tp2,cp2")
    ap.add_argument("--totals", default="128,512,1024,2048", help="total tokens per micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cp-mode", default="per-doc", choices=("per-doc", "per-seq"))
    ap.add_argument("--attn-backend", default="auto", choices=BACKENDS,
                    help="sdpa (auto on CPU) masks a dense T x T score matrix; reference computes per document")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="append CSV rows scheme,lengths,seconds")
    args = ap.parse_args(argv)
    try:
        totals = [int(x) for x in args.totals.split(",")]
        mbs = micro_batches(totals, args.seed)
        rows = []
        for s in args.schemes.split(","):
            t0 = time.perf_counter()
            secs = run_scheme(args.model, s.strip(), mbs, args.repeats, args.cp_mode, args.attn_backend)
            print(f"# {s}: measured in {time.perf_counter() - t0:.1f}s wall", file=sys.stderr)
            rows += [(s.strip(), mb, sec) for mb, sec in zip(mbs, secs)]
    except TidalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'scheme':<8} {'docs':>5} {'total':>6} {'sum_l2':>10} {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} "
          f"{'us/tok':>7}")
    for s, mb, (f, b) in rows:
        total, l2 = sum(mb), sum(x * x for x in mb)
        print(f"{s:<8} {len(mb):>5} {total:>6} {l2:>10} {f * 1e3:>8.2f} {b * 1e3:>8.2f} {(f + b) * 1e3:>8.2f} "
              f"{(f + b) / total * 1e6:>7.2f}")
    if args.out:
        fresh = not os.path.exists(args.out) or os.path.getsize(args.out) == 0
        with open(args.out, "a", newline="") as fh:
            if fresh:  # the profile format of docs/costmodel.md, read by `tidal plan --cost-model`
                fh.write(f"# tidal-profile/1 model={args.model} device=cpu backend={args.attn_backend}\n")
                fh.write("scheme,lengths,seconds\n")
            w = csv.writer(fh)
            for s, mb, (f, b) in rows:
                w.writerow([s, " ".join(map(str, mb)), f"{f + b:.6f}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
