"""Reliability scenarios of `tidal train` (issue 25; decisions 80-81), as a user meets them: a real launcher (tiny
Llama, 2 gloo ranks, background planner, checkpoints every 2 steps) in its own session, then

- SIGTERM / SIGINT / kill -9 to the launcher after 3 steps: seconds until no process of the run is left, the exit
  code, the one line printed, and whether `latest` is the newest complete checkpoint;
- SIGSTOP to rank 1 after 2 steps: seconds until the launcher names it (exits), against 2x the collective timeout;
- NaN gradients on rank 1 from step 3 on, max_consecutive_skips 2: the rows' skip flags, the exit code, `latest`;
- a healthy run longer than its collective timeout (no whole-run deadline): exit 0.

    python benchmarks/reliability.py                 # every scenario once
    python benchmarks/reliability.py --repeats 3     # the signal and SIGSTOP scenarios 3 times: median and worst

Wall-clock figures include the launcher's own Python start-up and exit; on a shared, loaded machine they are noisy
(the load average is printed beside them).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

import _reliability_cases as rc  # noqa: E402  # isort: skip


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _fmt(xs: list[float | None]) -> str:
    ok = [x for x in xs if x is not None]
    if not ok:
        return "never"
    worst = "never" if len(ok) < len(xs) else f"{max(ok):.2f}"
    return f"median {statistics.median(ok):.2f} s, worst {worst}" + (f" s (n={len(xs)})" if len(xs) > 1 else " s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--stop-timeout", type=float, default=3.0, help="collective timeout of the SIGSTOP scenario")
    ap.add_argument("--no-healthy", action="store_true", help="skip the healthy long run (minutes on a loaded machine)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidal-reliability-"))
    print(f"tidal train, tiny Llama, 2 gloo ranks + planner process; load average {_load()}")
    print()
    print("signal to the launcher after 3 steps (collective timeout 10 s, no whole-run deadline):")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        outs = [rc.signal_scenario(root / f"{sig.name}-{i}", sig, after_rows=3, timeout=10.0)
                for i in range(args.repeats)]
        o = outs[-1]
        same = all(x["latest"] == x["newest"] and x["latest"] is not None for x in outs)
        print(f"  {sig.name:<8} processes {o['processes']}, all gone after {_fmt([x['gone_s'] for x in outs])}; "
              f"exit {sorted({x['exit'] for x in outs}, key=str)}; latest = newest complete: {same} "
              f"({o['latest']}, {o['rows']} steps, run {o['run_s']:.0f} s before the signal)")
        print(f"           stderr: {o['stderr'] or '(nothing)'}")
    print(f"  load average {_load()}")
    print()
    t = args.stop_timeout
    outs = [rc.sigstop_scenario(root / f"stop-{i}", timeout=t) for i in range(args.repeats)]
    print(f"SIGSTOP rank 1 after 2 steps, collective timeout {t:g} s (bound: 2x = {2 * t:g} s):")
    print(f"  named after {_fmt([x['named_s'] for x in outs])} (SIGSTOP to the line naming it on stderr); exit "
          f"{sorted({x['exit'] for x in outs})}; all processes gone {_fmt([x['gone_s'] for x in outs])} after "
          f"the launcher's exit")
    print(f"  stderr: {outs[-1]['stderr']}")
    print(f"  load average {_load()}")
    print()
    o = rc.nan_scenario(root / "nan", rank=1, first=3, skips=2)
    print("NaN gradients on rank 1 from step 3, max_consecutive_skips 2:")
    print("  rows (step: skipped, non-finite ranks, grad norm): " + "; ".join(
        f"{r['step']}: {r['skipped']}, {r['nonfinite_ranks']}, {r['grad_norm']:.3g}" for r in o["rows"]))
    print(f"  exit {o['exit']}; latest {o['latest']} (newest complete {o['newest']})")
    print(f"  stderr: {o['stderr']}")
    if args.no_healthy:
        return
    print()
    t0 = time.monotonic()
    run = rc.start(root / "healthy", steps=30, timeout=3.0)
    code = run.proc.wait(timeout=1800)
    wall = time.monotonic() - t0
    print(f"healthy run, collective timeout 3 s, no deadline: {len(run.rows())} steps in {wall:.0f} s wall "
          f"({wall / 3:.0f}x the timeout), exit {code}; load average {_load()}")
    if code != 0:
        print(f"  stderr: {run.stderr().strip()}")


if __name__ == "__main__":
    main()
