"""The demo's comparison over several seeds (each seed draws other documents): Tidal's dynamic heterogeneous
strategies vs the best static homogeneous strategy, same documents per run pair. Prints per seed and the median, p90
and worst of the critical-path ratio (static / Tidal; > 1 means Tidal is faster), plus wall ratios, pull+push shares
and loss agreement.

    python benchmarks/train_demo.py                         # seeds 0 1 2, the demo's defaults
    python benchmarks/train_demo.py --seeds 0 1 2 3 --steps 10 --max-len 8192 --tokens-per-step 8192 --memory-gib 0.2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tidal.cli import demo
from tidal.cli.train import launch, train_entry
from tidal.runtime.train import prepare


def run_seed(args, seed: int, out: Path) -> dict:
    ns = argparse.Namespace(**{**vars(args), "seed": seed, "out": out})
    out.mkdir(parents=True, exist_ok=True)
    demo.calibrate(out / "profile.csv", args.max_len, seed)
    prof = str(out / "profile.csv")
    tidal_job = prepare(demo.base_config(ns, "auto", "", prof), args.nproc)
    static, _ = demo.best_static(ns, tidal_job, prof)
    static_job = prepare(demo.base_config(ns, static, "", prof), args.nproc)
    rows = {name: launch(job, train_entry, False, False, nproc=args.nproc, timeout_s=3000)[0].rows
            for name, job in (("tidal", tidal_job), ("static", static_job))}
    s = demo.compare(rows["tidal"], rows["static"])
    s["static_name"] = static
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=demo.DEFAULTS["nproc"])
    ap.add_argument("--max-len", type=int, default=demo.DEFAULTS["max_len"])
    ap.add_argument("--tokens-per-step", type=int, default=demo.DEFAULTS["tokens_per_step"])
    ap.add_argument("--memory-gib", type=float, default=demo.DEFAULTS["memory_gib"])
    ap.add_argument("--long-docs", default=demo.DEFAULTS["long_docs"])
    ap.add_argument("--data", default="stdlib:defs")
    args = ap.parse_args()
    print("| seed | best static | Tidal strategies | critical path Tidal / static (s) | ratio | incl. comm threads "
          "| wall ratio | pull+push CPU share | max loss rel. diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, proc, walls = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            s = run_seed(args, seed, Path(tmp) / f"s{seed}")
            ratios.append(s["speedup_critical_path"])
            proc.append(s["speedup_process_critical_path"])
            walls.append(s["speedup_wall"])
            print(f"| {seed} | {s['static_name']} | {', '.join(s['tidal']['strategies'])} | "
                  f"{s['tidal']['critical_path_s']:.2f} / {s['static']['critical_path_s']:.2f} | "
                  f"{s['speedup_critical_path']:.3f} | {s['speedup_process_critical_path']:.3f} | "
                  f"{s['speedup_wall']:.3f} | {s['tidal']['pull_push_cpu_share']:.2%} | "
                  f"{s['max_loss_rel_diff']:.1e} |", flush=True)
    for name, xs in (("critical path", ratios), ("incl. comm threads", proc), ("wall", walls)):
        a = np.asarray(xs)
        print(f"# {name} ratio static/Tidal over {len(a)} seeds: median {np.median(a):.3f}, p90 "
              f"{np.percentile(a, 10):.3f} (10th percentile: 90% of seeds are at least this), worst {a.min():.3f}")


if __name__ == "__main__":
    main()
