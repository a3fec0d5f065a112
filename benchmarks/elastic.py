"""Elastic restart (issue 25): `tidal train --elastic` on 8 gloo ranks (tiny model, strategies "auto", an
asynchronous checkpoint every 2 steps); one rank is killed with SIGKILL once step 10's checkpoint is published; the
agent restarts the job on the 7 survivors, re-planned for all 7, and it finishes. Prints the downtime (the kill to the
first step trained after the restart; detection, and the restart itself: spawn, build, warm-up, load), the steps
trained twice, and per phase the strategies used and the throughput (median and p90 over steps of tokens per step
wall second; the critical path's CPU seconds beside it). The machine's other load makes every figure noisy.

    python benchmarks/elastic.py [--ranks 8] [--kill-at 10] [--steps 20] [--victim 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

CONFIG = """
[model]
name = "tiny"
[world]
cluster = "cpux{ranks}"
[data]
source = "stdlib:defs"
max_len = 256
tokens_per_step = 2048
[planner]
strategies = "auto"
[optimizer]
warmup_steps = 2
decay_steps = 20
[train]
steps = {steps}
progress = false
metrics = "{metrics}"
checkpoint_dir = "{ckpt}"
checkpoint_every = 2
"""


def _children(pid: int) -> list[int]:
    """The spawned rank processes of `pid`, in creation order (= rank order)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and "spawn_main" in cmd and "resource_tracker import" not in cmd:
            out.append(int(d.name))
    return sorted(out)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--kill-at", type=int, default=10, help="kill once this step's checkpoint is published")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--victim", type=int, default=3, help="rank to kill")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tidal-elastic-"))
    metrics, ckpt = tmp / "metrics.jsonl", tmp / "ckpt"
    cfg = tmp / "train.toml"
    cfg.write_text(CONFIG.format(ranks=args.ranks, steps=args.steps, metrics=metrics, ckpt=ckpt))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t_start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "train", "--config", str(cfg), "--nproc",
                             str(args.ranks), "--elastic"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env=env)
    lines: list[tuple[float, str]] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    seen: set[str] = set()
    events: list[tuple[float, dict]] = []  # (arrival time, row), in arrival order
    t_kill = None
    while proc.poll() is None:
        now = time.monotonic()
        try:
            text = metrics.read_text()
        except OSError:
            text = ""
        for line in text.splitlines():
            if line.strip() and line not in seen:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # being written
                seen.add(line)
                events.append((now, row))
        if t_kill is None:
            try:
                latest = (ckpt / "latest").read_text().strip()
            except OSError:
                latest = ""
            if latest == f"step-{args.kill_at:06d}":
                ranks = _children(proc.pid)
                if len(ranks) == args.ranks:
                    os.kill(ranks[args.victim], signal.SIGKILL)
                    t_kill = time.monotonic()
                    killed_after = max((r["step"] for _, r in events), default=-1)
        time.sleep(0.05)
    reader.join(timeout=5)
    text = metrics.read_text() if metrics.exists() else ""
    for line in text.splitlines():
        if line.strip() and line not in seen:
            seen.add(line)
            events.append((time.monotonic(), json.loads(line)))
    print(f"# {args.ranks} gloo ranks, tiny model, {args.steps} steps, async checkpoints every 2 steps; rank "
          f"{args.victim} SIGKILLed once step-{args.kill_at:06d} was published; exit code {proc.returncode}; "
          f"{time.monotonic() - t_start:.0f} s in all")
    for t, line in lines:
        if line.startswith(("elastic:", "resume:")):
            print(f"  [{t - t_start:6.1f} s] {line}")
    if t_kill is None:
        print("the run ended before the kill point; nothing measured")
        return
    before = [(t, r) for t, r in events if t <= t_kill]
    after = [(t, r) for t, r in events if t > t_kill]
    t_detect = next((t for t, line in lines if line.startswith("elastic:") and t > t_kill), float("nan"))
    t_first = after[0][0] if after else float("nan")
    final = [json.loads(x) for x in text.splitlines() if x.strip()]
    print(f"cold start (launch -> first step, 8 ranks): {events[0][0] - t_start:.1f} s")
    print(f"downtime {t_first - t_kill:.1f} s (kill -> first step after the restart): detection "
          f"{t_detect - t_kill:.1f} s, restart (spawn, build, warm-up, load, first step) {t_first - t_detect:.1f} s; "
          f"steps trained after the checkpoint and lost: {killed_after + 1 - args.kill_at}")
    for name, phase in (("before (8 ranks)", before[2:]), ("after (survivors)", after[1:])):
        rows = [r for _, r in phase]
        if not rows:
            print(f"{name}: no steps")
            continue
        tps = [r["tokens"] / r["wall_s"] for r in rows]
        cpu = [r["process_critical_path_s"] for r in rows]
        wall = [r["wall_s"] for r in rows]
        strat = ", ".join(f"{s} x{n}" for s, n in Counter(r["strategy"] for r in rows).most_common())
        print(f"{name}: {len(rows)} steps; strategies {strat}; tokens/s median {statistics.median(tps):,.0f} "
              f"p90 {_pct(tps, 0.9):,.0f} worst {min(tps):,.0f}; step wall median {statistics.median(wall):.2f} s, "
              f"critical-path CPU median {statistics.median(cpu):.2f} s; busy_s per rank: {len(rows[0]['busy_s'])}")
    steps = [r["step"] for r in final]
    print(f"metrics file: {len(final)} rows, steps {steps[0]}..{steps[-1]}, duplicates "
          f"{len(steps) - len(set(steps))}; latest {(ckpt / 'latest').read_text().strip()}")


if __name__ == "__main__":
    main()
