"""`tidal verify`'s comparison for many strategy specs on 8 gloo ranks, in one spawn: per spec, the max relative
difference (per tensor, max|x - x_ref| / max|x_ref|) of losses, parameters and Adam moments against one process after
5 steps, strategies switched every step for ';'-lists. Prints a table and the tolerances.

    python benchmarks/train_verify.py                    # float64, the 11 specs of tests/runtime/test_executor.py
    python benchmarks/train_verify.py --dtype float32
    python benchmarks/train_verify.py --only hetero-pp,tied-pp    # some of the specs, by name
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from tidal.cli.train import VERIFY_TOL, replay_reference, verify_report  # noqa: E402
from tidal.runtime.launch import run_distributed  # noqa: E402
from tidal.runtime.train import prepare  # noqa: E402

from _train_cases import jobs_worker  # noqa: E402  # isort: skip
from test_executor import CASES, _config  # noqa: E402  # isort: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", choices=tuple(VERIFY_TOL), default="float64")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated spec names (default: all)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {c[0] for c in CASES})
    if unknown:
        ap.error(f"unknown spec(s) {', '.join(unknown)}; one of {', '.join(c[0] for c in CASES)}")
    cases = [c for c in CASES if not names or c[0] in names]
    jobs = []
    for _, model, strategies in cases:
        cfg = _config(model, strategies, steps=args.steps)
        tr = cfg.train.__class__(**{**cfg.train.__dict__, "master_dtype": args.dtype, "compute_dtype": args.dtype})
        jobs.append(prepare(cfg.__class__(**{**cfg.__dict__, "train": tr}), 8))
    t0 = time.perf_counter()
    results = run_distributed(jobs_worker, 8, jobs, timeout_s=3000)[0]
    wall = time.perf_counter() - t0
    tol = VERIFY_TOL[args.dtype]
    print(f"# {len(cases)} specs x {args.steps} steps on 8 gloo ranks, {args.dtype}, {wall:.0f} s; tolerance: loss "
          f"{tol['loss']:.0e}, parameters {tol['params']:.0e}, moments {tol['moments']:.0e}")
    print("| spec | strategies used | loss | parameters | moments | pass |\n|---|---|---|---|---|---|")
    worst = {"loss": 0.0, "params": 0.0, "moments": 0.0}
    for (name, _, _), job, res in zip(cases, jobs, results):
        losses, ref = replay_reference(job, res.rows)
        rep = verify_report(res.rows, losses, res.state, ref)
        ok = all(rep[k] <= tol[k] for k in worst)
        for k in worst:
            worst[k] = max(worst[k], rep[k])
        used = " → ".join(dict.fromkeys(r["strategy"] for r in res.rows))
        print(f"| {name} | {used} | {rep['loss']:.1e} | {rep['params']:.1e} | {rep['moments']:.1e} | "
              f"{'yes' if ok else 'NO'} |")
    print(f"# worst: loss {worst['loss']:.1e}, parameters {worst['params']:.1e}, moments {worst['moments']:.1e}")


if __name__ == "__main__":
    main()
