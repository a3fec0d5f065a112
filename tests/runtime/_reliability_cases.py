"""Reliability scenarios of `tidal train` as a user meets them (shared by tests/runtime/test_reliability.py and
benchmarks/reliability.py): a real launcher started in its own session, a signal sent to it (or SIGSTOP to one rank),
then every process of the session watched until it is gone.

A run: tiny Llama on 2 gloo ranks, stdlib:defs, checkpoints every 2 steps, the planner in a background process
(plan_ahead 1), so the session holds the launcher, two ranks, the planner and multiprocessing's resource tracker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CONFIG = """
[model]
name = "tiny"
attn_backend = "sdpa"
[world]
cluster = "cpux2"
[data]
source = "stdlib:defs"
max_len = 128
tokens_per_step = 512
[planner]
strategies = "2*tp1;tp2"
[optimizer]
lr = 1e-3
warmup_steps = 1
[train]
steps = {steps}
progress = false
plan_ahead = 1
checkpoint_every = 2
collective_timeout_s = {timeout}
stop_grace_s = 30.0
cost_model_warn = 0.0  # its warning depends on this machine's speed; these runs check the lifecycle's own lines
{extra}
"""


@dataclass
class Run:
    proc: subprocess.Popen
    workdir: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def metrics(self) -> Path:
        return self.workdir / "m.jsonl"

    @property
    def ckpt(self) -> Path:
        return self.workdir / "ck"

    def rows(self) -> list[dict]:
        try:
            return [json.loads(ln) for ln in self.metrics.read_text().splitlines() if ln.strip()]
        except OSError:
            return []

    def stderr(self) -> str:
        return (self.workdir / "stderr.txt").read_text()


def start(workdir: Path, steps: int = 40, timeout: float = 60.0, extra: str = "", nproc: int = 2) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "run.toml"
    cfg.write_text(CONFIG.format(steps=steps, timeout=timeout, extra=extra))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "tidal.cli.main", "train", "--config", str(cfg), "--nproc", str(nproc),
           "--checkpoint-dir", str(workdir / "ck"), "--metrics", str(workdir / "m.jsonl")]
    with open(workdir / "stdout.txt", "w") as out, open(workdir / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
    return Run(proc, workdir)


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return [text[: text.rfind(")") + 1]] + text[text.rfind(")") + 2 :].split()


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid` (the launcher's pid: it was started with start_new_session)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))  # [comm, state, ppid, pgrp, session, ...]
            if st is not None and st[1] != "Z" and int(st[4]) == sid:
                out.append(int(d))
    return out


def rank_pids(launcher: int) -> list[int]:
    """The launcher's spawned ranks in rank order (start time), not its resource tracker."""
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is None or int(st[2]) != launcher:
                continue
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd:
                kids.append((int(st[20]), int(d)))
    return [pid for _, pid in sorted(kids)]


def wait_rows(run: Run, n: int, timeout_s: float = 600.0) -> None:
    end = time.monotonic() + timeout_s
    while len(run.rows()) < n:
        if run.proc.poll() is not None:
            raise AssertionError(f"run ended (exit {run.proc.returncode}) before {n} steps: {run.stderr()}")
        if time.monotonic() > end:
            raise AssertionError(f"no {n} steps within {timeout_s} s")
        time.sleep(0.05)


def wait_gone(run: Run, timeout_s: float) -> float | None:
    """Seconds until no process of the run's session is alive (None: some still alive after `timeout_s`)."""
    t0 = time.monotonic()
    sid = run.proc.pid
    while time.monotonic() - t0 < timeout_s:
        run.proc.poll()  # reap the launcher (a zombie until then)
        if not session_pids(sid):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def kill_session(run: Run) -> None:
    for pid in session_pids(run.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run.proc.wait(timeout=30)


def newest_complete(ckpt: Path) -> str | None:
    done = sorted(p.name for p in ckpt.glob("step-*") if (p / "manifest.json").is_file() and p.suffix == "")
    return done[-1] if done else None


def latest(ckpt: Path) -> str | None:
    try:
        return (ckpt / "latest").read_text().strip()
    except OSError:
        return None


def wait_checkpoint(run: Run, timeout_s: float = 600.0) -> None:
    """Until `latest` names a complete checkpoint. The step-2 checkpoint is written asynchronously while step 3
    trains (`async_checkpoint`), so on a loaded machine step 3's row can be logged before it is complete."""
    end = time.monotonic() + timeout_s
    while latest(run.ckpt) is None or newest_complete(run.ckpt) is None:
        if run.proc.poll() is not None:
            raise AssertionError(f"run ended (exit {run.proc.returncode}) before its first checkpoint: {run.stderr()}")
        if time.monotonic() > end:
            raise AssertionError(f"no complete checkpoint within {timeout_s} s")
        time.sleep(0.05)


def signal_scenario(workdir: Path, sig: int, after_rows: int = 3, steps: int = 40, timeout: float = 60.0) -> dict:
    """Start a run, send `sig` to the launcher once `after_rows` steps are logged and a checkpoint is complete; how it
    ended."""
    run = start(workdir, steps=steps, timeout=timeout)
    try:
        wait_rows(run, after_rows)
        wait_checkpoint(run)
        in_session = len(session_pids(run.proc.pid))
        t0 = time.monotonic()
        os.kill(run.proc.pid, sig)
        gone = wait_gone(run, 30.0)
        code = run.proc.wait(timeout=30) if gone is not None else None
        return {"signal": signal.Signals(sig).name, "processes": in_session, "gone_s": gone, "exit": code,
                "stderr": run.stderr().strip(), "latest": latest(run.ckpt), "newest": newest_complete(run.ckpt),
                "rows": len(run.rows()), "run_s": t0 - run.started}
    finally:
        if run.proc.poll() is None or session_pids(run.proc.pid):
            kill_session(run)


def sigstop_scenario(workdir: Path, timeout: float = 3.0, stop_rank: int = 1, after_rows: int = 2) -> dict:
    """SIGSTOP one rank mid-run; how long until the launcher names it, and what it says."""
    run = start(workdir, steps=200, timeout=timeout)
    try:
        wait_rows(run, after_rows)
        ranks = rank_pids(run.proc.pid)
        t0 = time.monotonic()
        os.kill(ranks[stop_rank], signal.SIGSTOP)
        end, named = t0 + max(60.0, 10 * timeout), None
        while time.monotonic() < end:  # the user's view: when the line naming the rank is printed
            done = run.proc.poll() is not None
            if run.stderr().strip():
                named = time.monotonic() - t0
                break
            if done:
                break
            time.sleep(0.02)
        code = run.proc.wait(timeout=60)
        gone = wait_gone(run, 10.0)
        return {"timeout_s": timeout, "named_s": named, "exit": code, "stderr": run.stderr().strip(),
                "gone_s": gone, "ranks": ranks, "rows": len(run.rows())}
    finally:
        if run.proc.poll() is None or session_pids(run.proc.pid):
            kill_session(run)


def nan_scenario(workdir: Path, rank: int = 1, first: int = 3, skips: int = 2) -> dict:
    """NaN gradients on one rank from step `first` on; the run must stop after `skips` skipped steps."""
    run = start(workdir, steps=12, extra=f'inject_nan = "{rank}@{first}-99"\nmax_consecutive_skips = {skips}')
    try:
        code = run.proc.wait(timeout=300)
        return {"exit": code, "stderr": run.stderr().strip(), "rows": run.rows(), "latest": latest(run.ckpt),
                "newest": newest_complete(run.ckpt), "ckpt": run.ckpt}
    finally:
        if run.proc.poll() is None or session_pids(run.proc.pid):
            kill_session(run)
