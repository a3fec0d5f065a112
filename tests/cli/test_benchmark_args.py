"""Bad arguments to the planner grid benchmark end in one line, not a traceback (benchmarks/planner.py --grid)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "planner.py"


@pytest.mark.parametrize("args, says", [
    (["--seeds", "", "--held-out-seeds", ""], "no seeds: give --seeds, --held-out-seeds or both"),
    (["--seeds", "x"], "--seeds takes comma-separated integers, got 'x'"),
    (["--held-out-seeds", "10,y"], "--held-out-seeds takes comma-separated integers, got '10,y'"),
    (["--drop", "nope"], "unknown pass(es) ['nope']"),
])
def test_grid_bad_arguments_are_one_line(args, says):
    r = subprocess.run([sys.executable, str(SCRIPT), "--grid", "--models", "llama2-13b", "--clusters", "a800x16",
                        "--cands", "hand", "--steps", "1", "--hy-trials", "0", *args],
                       capture_output=True, text=True, timeout=120, cwd=SCRIPT.parent)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr.strip().splitlines()[-1], r.stderr
