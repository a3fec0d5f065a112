"""Plan time before and after a planner change, measured in one interleaved run (issue 27's plan-time figure).

    python benchmarks/plan_time_ab.py --before /path/to/old/checkout --after . [--steps 6] [--seeds 10]
        [--models llama2-7b,llama2-13b,llama-32b] [--clusters a800x16,a800x32,a800x64,a800x256,a800x1024] [--collect]
        [--cands hand|proposal]

Two worker processes, one per source tree (PYTHONPATH=<tree>/src, one thread each: OMP/MKL/NUMBA threads 1), each
import their own `tidal`, build the grid's hand candidates (`--cands proposal`: its strategy proposal's, made by each
tree and not timed; each tree's own benchmarks/planner_grid.py; the plan
hashes show that both planned the same steps) and warm the compiled loops; each cell's first step is also planned
once unmeasured by both. The parent sends the same step to both in an ABBA order (so drift in the shared machine's
load hits both alike) and records select_step's CPU time (thread_time) and wall time per step. It prints, per cell,
median / p90 / max of CPU and wall ms before and after, the ratio of the CPU medians, and whether both trees gave
the same plan (hash of StepPlan without plan_ms); then, per cluster size, the worst cell's CPU p90 before and after.
A full garbage collection (gen 2: tens of ms once the worker holds many objects) lands in whichever step crosses
Python's threshold, in one worker and not the other; `--collect` runs one before each measured step, untimed.
Nothing is asserted. A source with fewer steps than asked (stdlib at 1024 GPUs) is measured on the steps it has; a
step no candidate can hold is skipped (both trees).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = r"""
import contextlib, gc, hashlib, json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from planner_grid import MAX_LEN, TOKENS, Grid, warm_kernels
from tidal.core import TidalError, get_cluster
from tidal.data import sample_steps
from tidal.planner.select import select_step
tmp = tempfile.TemporaryDirectory()
grid = Grid(Path(tmp.name))
warm_kernels()
cache = {}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    q = json.loads(line)
    key = (q["model"], q["cluster"], q["source"], q["seed"], q.get("cands", "hand"))
    if key not in cache:
        with contextlib.redirect_stdout(sys.stderr):  # the grid's own messages (a failed proposal) stay off the pipe
            _, profs, _ = grid.candidates(q["model"], q["cluster"], q.get("cands", "hand"), q["source"])
        tokens = TOKENS[get_cluster(q["cluster"]).num_devices]
        sts = sample_steps(grid.specs[q["source"]], seed=q["seed"], tokens_per_step=tokens, max_len=MAX_LEN,
                           steps=q["steps"])[0]
        cache = {key: (profs, [s.lengths_array() for s in sts])}
    profs, ls = cache[key]
    if q["step"] >= len(ls):
        print(json.dumps({"skip": True}), flush=True)
        continue
    if q.get("collect"):  # --collect: a full collection now, so that none falls inside the measured step
        gc.collect()
    c0, w0 = time.thread_time(), time.perf_counter()
    try:
        plan = select_step(ls[q["step"]], profs, seed=0).plan
    except TidalError:  # e.g. a document longer than every candidate's MaxLen: not a plan-time figure
        print(json.dumps({"skip": True}), flush=True)
        continue
    cpu, wall = (time.thread_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3
    h = hashlib.sha256(json.dumps(plan.to_dict(timings=False), sort_keys=True).encode()).hexdigest()[:16]
    print(json.dumps({"cpu": cpu, "wall": wall, "hash": h}), flush=True)
"""


def start(tree: Path, bench: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               NUMBA_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(bench)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    if not json.loads(p.stdout.readline()).get("ready"):
        raise SystemExit(f"worker for {tree} did not start")
    return p


def ask(p: subprocess.Popen, q: dict) -> dict:
    p.stdin.write(json.dumps(q) + "\n")
    p.stdin.flush()
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"a worker died on {q}")
    return json.loads(line)


def q(xs, p):
    return float(np.quantile(np.asarray(xs, dtype=np.float64), p))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the old source tree (a checkout with src/tidal)")
    ap.add_argument("--after", default=".", help="the new source tree (default: this checkout)")
    ap.add_argument("--models", default="llama2-7b,llama2-13b,llama-32b")
    ap.add_argument("--clusters", default="a800x16,a800x32,a800x64,a800x256,a800x1024")
    ap.add_argument("--sources", default="commoncrawl,github,flanv2,heavytail,stdlib")
    ap.add_argument("--seeds", default="10", help="held-out seeds by default")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cands", choices=("hand", "proposal"), default="hand",
                    help="the grid's hand candidates, or its strategy proposal's (made by each tree, unmeasured)")
    ap.add_argument("--collect", action="store_true",
                    help="gc.collect() in both workers before each measured step (not timed): Python's full "
                         "collections (tens of ms in a long-running worker) then fall outside the steps")
    a = ap.parse_args()
    before, after = Path(a.before).resolve(), Path(a.after).resolve()
    workers = {"before": start(before, before / "benchmarks"), "after": start(after, after / "benchmarks")}
    print(f"before: {before}\nafter:  {after}\nms per step, one thread per worker, ABBA order; cpu = thread_time")
    print("| model | cluster | source | steps | before cpu med / p90 / max | after cpu med / p90 / max | "
          "after/before cpu med | before wall p90 | after wall p90 | same plans |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst: dict[int, list[float]] = {}
    k = 0
    try:
        for model in a.models.split(","):
            for cluster in a.clusters.split(","):
                n = int(cluster.split("x")[-1])
                for source in a.sources.split(","):
                    t = {"before": {"cpu": [], "wall": []}, "after": {"cpu": [], "wall": []}}
                    same = 0
                    for w in workers.values():  # unmeasured: first calls (numba's lazy compiles, caches) of the cell
                        ask(w, {"model": model, "cluster": cluster, "source": source, "cands": a.cands,
                                "seed": int(a.seeds.split(",")[0]), "steps": a.steps, "step": 0})
                    for seed in (int(s) for s in a.seeds.split(",")):
                        for step in range(a.steps):
                            qq = {"model": model, "cluster": cluster, "source": source, "seed": seed,
                                  "steps": a.steps, "step": step, "collect": a.collect, "cands": a.cands}
                            order = ("before", "after") if k % 2 == 0 else ("after", "before")
                            k += 1
                            res = {w: ask(workers[w], qq) for w in order}
                            if any(r.get("skip") for r in res.values()):
                                continue
                            for w in order:
                                t[w]["cpu"].append(res[w]["cpu"])
                                t[w]["wall"].append(res[w]["wall"])
                            same += res["before"]["hash"] == res["after"]["hash"]
                    b, f = t["before"], t["after"]
                    cnt = len(b["cpu"])
                    if not cnt:
                        continue
                    print(f"| {model} | {cluster} | {source} | {cnt} | {q(b['cpu'], .5):.1f} / {q(b['cpu'], .9):.1f}"
                          f" / {max(b['cpu']):.1f} | {q(f['cpu'], .5):.1f} / {q(f['cpu'], .9):.1f} / "
                          f"{max(f['cpu']):.1f} | {q(f['cpu'], .5) / q(b['cpu'], .5):.3f} | {q(b['wall'], .9):.1f} | "
                          f"{q(f['wall'], .9):.1f} | {same}/{cnt} |", flush=True)
                    wb, wf = worst.setdefault(n, [0.0, 0.0])[:2]
                    worst[n] = [max(wb, q(b["cpu"], .9)), max(wf, q(f["cpu"], .9))]
    finally:
        for p in workers.values():
            p.stdin.close()
            p.wait(timeout=60)
    print("\n| GPUs | worst cell cpu p90 before (ms) | after (ms) |\n|---|---|---|")
    for n in sorted(worst):
        print(f"| {n} | {worst[n][0]:.1f} | {worst[n][1]:.1f} |")


if __name__ == "__main__":
    main()
