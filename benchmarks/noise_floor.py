"""The measurement noise floor of per-step calibration on this machine (issue 11).

Runs the same step again and again: `--steps` steps, each `--mbs` identical micro-batches of one `--len`-token
document, through the real runtime (`runtime.profiler.profile_scheme`: forward + backward, the ranks' CPU time,
`time.thread_time`, the slowest rank of the pipeline, exactly what training's calibration rows measure). The work
never changes, so the best possible cost model predicts one number for every step; its error is the noise floor:

    |t_step / median(t_step) - 1|   (median, p90, max over the steps)

A calibration target tighter than this floor cannot be met by any cost model while the machine behaves this way;
compare it with `benchmarks/calibration.py`'s figures taken at the same time.

    python benchmarks/noise_floor.py                                 # cpux2 tp2 and cpux4 tp4, 50 steps, ~2 min
    python benchmarks/noise_floor.py --cluster cpux2 --scheme tp2 --steps 100
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tidal.core import get_cluster, get_model, parse_scheme
from tidal.runtime.profiler import profile_scheme


def floor(cluster: str, scheme: str, steps: int, mbs: int, length: int, seed: int) -> dict:
    cl, spec, sc = get_cluster(cluster), get_model("tiny"), parse_scheme(scheme)
    t0 = time.perf_counter()
    prof = profile_scheme(spec, cl, sc, [[length]] * (steps * mbs), attn_backend="sdpa", seed=seed)
    t = np.array([p.seconds for p in prof.points]).reshape(steps, mbs).sum(axis=1)
    err = np.abs(t / np.median(t) - 1.0)
    return {"cluster": cluster, "scheme": scheme, "steps": steps, "step_s": float(np.median(t)),
            "median": float(np.median(err)), "p90": float(np.quantile(err, 0.9)), "max": float(err.max()),
            "spread": float(t.max() / t.min()), "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", default=None, help="one cluster (default: cpux2 with tp2, then cpux4 with tp4)")
    ap.add_argument("--scheme", default=None, help="the scheme whose one pipeline spans the cluster")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--mbs", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--len", type=int, default=1024, help="tokens per micro-batch (one document)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cells = [(args.cluster, args.scheme or f"tp{get_cluster(args.cluster).num_devices}")] if args.cluster else \
        [("cpux2", "tp2"), ("cpux4", "tp4")]
    print(f"# the same step ({args.mbs} x {args.len} tokens, tiny) {args.steps} times; "
          "|t / median - 1| per step, the best any cost model can do")
    print("| cluster | scheme | steps | step CPU s (median) | median | p90 | max | max / min | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cluster, scheme in cells:
        r = floor(cluster, scheme, args.steps, args.mbs, args.len, args.seed)
        print(f"| {r['cluster']} | {r['scheme']} | {r['steps']} | {r['step_s']:.3f} | {r['median']:.1%} | "
              f"{r['p90']:.1%} | {r['max']:.1%} | {r['spread']:.2f} | {r['wall_s']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
