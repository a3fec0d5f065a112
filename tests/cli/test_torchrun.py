"""`tidal train` under torchrun (`--nnodes 1 --nproc-per-node 4 --rdzv-backend c10d`) with its output in a log file:
start-up lines, one plain line per step, the checkpoint announced, the summary table whole (issue 26 item 3)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.core.model import get_model
from tidal.costmodel.flops import train_flops

from _tiny_config import tiny_toml  # isort: skip

CONFIG = tiny_toml(train='steps = 2\nmetrics = "m.jsonl"\ncheckpoint_dir = "ck"\n')


@pytest.mark.distributed
def test_torchrun_log_file_has_a_line_per_step(tmp_path):
    import json

    (tmp_path / "c.toml").write_text(CONFIG)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    env.pop("COLUMNS", None)
    with open(tmp_path / "log.txt", "w") as log:
        rc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "-m", "tidal", "train",
                             "--config", "c.toml"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                            timeout=300).returncode
    text = (tmp_path / "log.txt").read_text()
    assert rc == 0, text[-3000:]
    lines = text.splitlines()
    steps = [x for x in lines if x.startswith("step ")]
    assert [x.split(" | ")[0] for x in steps] == ["step 1/2", "step 2/2"], text
    assert all(" tok/s | " in x and " | rss " in x and "% (nominal) | " in x for x in steps), steps
    assert any("] planning: " in x for x in lines) and any("] warming up 2 candidate" in x for x in lines)
    assert any("] checkpoint saved: ck/step-000002 (step 2" in x for x in lines)
    assert any(x.startswith("│ ") and "pull+push" not in x and "5." in x for x in lines)  # the loss column is there
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    for r in rows:  # the row's memory and MFU fields (what the line prints)
        assert len(r["peak_mem_bytes"]) == 4 and min(r["peak_mem_bytes"]) > 2**20 and r["mem_kind"] == "rss"
        tiny, n = get_model("tiny"), r["tokens"]  # between n one-token documents and one n-token document
        assert train_flops(tiny, [1] * n) < r["model_flops"] < train_flops(tiny, [n])
        assert r["mfu"] == pytest.approx(r["model_flops"] / r["wall_s"] / (4 * 5e10))
