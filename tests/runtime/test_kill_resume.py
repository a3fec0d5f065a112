"""`kill -9` of a rank mid-run, then `tidal train --resume`: the final checkpoint is bit-identical to an uninterrupted
run's, and the metrics file holds each step once, equal to the uninterrupted run's rows (2 gloo ranks, tiny model,
float64, an asynchronous checkpoint every step). Tolerance: exact."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tidal.core.model import get_model, param_table
from tidal.runtime import checkpoint as ckpt

pytestmark = [pytest.mark.reliability, pytest.mark.distributed]

CONFIG = """
[model]
name = "tiny"
[world]
cluster = "cpux2"
[data]
source = "stdlib:defs"
max_len = 192
tokens_per_step = 768
[planner]
strategies = "2*tp1;tp2"
[optimizer]
warmup_steps = 2
decay_steps = 6
[train]
steps = 5
master_dtype = "float64"
progress = false
plan_ahead = 0
checkpoint_every = 1
"""
FIELDS = ("step", "strategy", "documents", "tokens", "loss", "grad_norm")


def _train(cfg: Path, d: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "train", "--config", str(cfg), "--nproc", "2",
                             "--checkpoint-dir", str(d / "ckpt"), "--metrics", str(d / "m.jsonl"), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _ranks(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (p / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmd and b"resource_tracker import" not in cmd:
            out.append(int(p.name))
    return sorted(out)


def test_kill_9_of_a_rank_then_resume_is_bit_identical(tmp_path):
    cfg = tmp_path / "train.toml"
    cfg.write_text(CONFIG)
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    straight.mkdir()
    broken.mkdir()
    a = _train(cfg, straight)
    b = _train(cfg, broken)
    deadline = time.monotonic() + 600
    while b.poll() is None and time.monotonic() < deadline:  # kill rank 1 once step 2 is published
        latest = broken / "ckpt" / "latest"
        if latest.exists() and latest.read_text().strip() == "step-000002" and len(_ranks(b.pid)) == 2:
            os.kill(_ranks(b.pid)[1], signal.SIGKILL)
            break
        time.sleep(0.02)
    _, err = b.communicate(timeout=300)
    assert b.returncode != 0 and "rank 1 died with exit code -9" in err
    c = _train(cfg, broken, "--resume")
    _, err_c = c.communicate(timeout=600)
    assert c.returncode == 0, err_c
    _, err_a = a.communicate(timeout=600)
    assert a.returncode == 0, err_a
    rows = {k: [json.loads(x) for x in (d / "m.jsonl").read_text().splitlines()] for k, d in
            (("a", straight), ("b", broken))}
    assert [r["step"] for r in rows["b"]] == list(range(5))  # no duplicated or missing rows
    assert [[r[f] for f in FIELDS] for r in rows["b"]] == [[r[f] for f in FIELDS] for r in rows["a"]]
    assert [r["data"] for r in rows["b"]] == [r["data"] for r in rows["a"]]
    for i, _ in enumerate(param_table(get_model("tiny"))):
        for kind in ckpt.KINDS:
            x = ckpt.read_slice(straight / "ckpt" / "step-000005", kind, i, dtype=torch.float64)
            y = ckpt.read_slice(broken / "ckpt" / "step-000005", kind, i, dtype=torch.float64)
            assert torch.equal(x, y), (kind, i)
