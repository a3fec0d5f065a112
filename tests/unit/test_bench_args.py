"""The proof and grid benchmarks refuse bad arguments with one line, before any planning (no traceback)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("argv, says", [
    (["planner.py", "--grid", "--prove-pool", "-2"], "--prove-pool and --prove-forced take seconds >= 0"),
    (["planner.py", "--grid", "--prove-milp", "nan"], "--prove-milp, --prove-pool and --prove-forced"),
    (["planner.py", "--grid", "--prove-forced", "-1"], "got 0.0, 0.0, -1.0"),
    (["planner.py", "--grid", "--pool-halvings", "3"], "needs --prove-pool or --prove-forced S > 0"),
    (["planner.py", "--grid", "--forced-kinds", "0.0099"], "needs --prove-forced S > 0; got 0.0099"),
    (["planner.py", "--grid", "--prove-forced", "10", "--forced-kinds", "1.5"], "--forced-kinds takes a gap in (0, 1)"),
    (["planner.py", "--grid", "--seeds", "", "--held-out-seeds", ""], "no seeds: give --seeds, --held-out-seeds"),
    (["planner.py", "--grid", "--seeds", "x"], "--seeds takes comma-separated integers, got 'x'"),
    (["planner.py", "--grid", "--held-out-seeds", "10,y"], "--held-out-seeds takes comma-separated integers"),
    (["planner.py", "--grid", "--drop", "nope"], "unknown pass(es) ['nope']"),
    (["gap_pool.py", "--model", "nope"], "unknown model preset 'nope'"),
    (["gap_exact.py", "--model", "nope", "--cluster", "a800x16"], "unknown model preset 'nope'"),
    (["gap_pool.py", "--pool-s", "0"], "--pool-s must be > 0"),
    (["gap_pool.py", "--variants", "plain,nope"], "--variants must name some of plain, counts, rows"),
    (["gap_pool.py", "--rows-iters", "0"], "--rows-iters must be >= 1"),
    (["gap_whole.py", "--pack-s", "0"], "--time-limit and --pack-s must be > 0"),
    (["gap_search.py", "--restarts", "0"], "--restarts and --k must be >= 1"),
    (["gap_search.py", "--time-limit", "0"], "--lns-rounds and --k-long >= 0 and --time-limit > 0"),
    (["gap_search.py", "--model", "nope"], "unknown model preset 'nope'"),
    (["gap_search.py", "--min-gap", "-0.01"], "--min-gap must be >= 0"),
    (["gap_trim.py", "--excess", "0"], "--excess in (0, 1]"),
    (["gap_forced.py", "--rules", "bf,nope"], "--rules must name some of bf, mc, wf, ff"),
    (["gap_forced.py", "--step", "0"], "--step > 0"),
])
def test_proof_benchmarks_refuse_bad_arguments_in_one_line(argv, says):
    r = subprocess.run([sys.executable, *argv], cwd=BENCH, capture_output=True, text=True, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len([x for x in err if "error" in x]) == 1, r.stderr
