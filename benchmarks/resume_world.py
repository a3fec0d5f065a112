"""Resume across world sizes (issue 25): 8 -> 6 -> 8 gloo ranks, each launch resuming from the previous one's
checkpoint under another strategy list (tiny model, float64 masters, 2 steps per launch). Prints, per launch, whether
the weights and Adam moments a fresh executor loads are bit-equal to the state saved (tensors that differ: 0 wanted),
then whether every step trained the uninterrupted stream's documents, none twice, and the exactly-once counters
match step by step. (CI runs the same check at 4 -> 3 -> 4 ranks: tests/runtime/test_resume_anywhere.py.)

    python benchmarks/resume_world.py [--worlds 8,6,8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from tidal.runtime.launch import run_distributed  # noqa: E402
from tidal.runtime.train import make_ledger, make_planner, open_corpus, prepare  # noqa: E402

from _resume_cases import chain_worker, config  # noqa: E402  # isort: skip

STRATEGIES = {8: "4*tp2", 6: "tp2+4*tp1", 4: "cp2+tp2", 3: "tp2+tp1"}
LATER = {8: "tp2pp2+cp2+2*tp1", 6: "cp2+tp2+2*tp1", 4: "tp2+2*tp1", 3: "cp2+tp1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="8,6,8")
    ap.add_argument("--steps-per-launch", type=int, default=2)
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    k = args.steps_per_launch
    d = tempfile.mkdtemp(prefix="tidal-resume-world-")
    state, rows, seen = None, [], set()
    print(f"# {' -> '.join(map(str, worlds))} gloo ranks, tiny model, float64, {k} steps per launch")
    for i, w in enumerate(worlds):
        strategies = STRATEGIES[w] if w not in seen else LATER[w]
        seen.add(w)
        t0 = time.perf_counter()
        out = run_distributed(chain_worker, w, [(strategies, k * (i + 1))], d, state, timeout_s=3000)[0]
        print(f"{w} ranks, {strategies}: steps {[r['step'] for r in out['rows']]}, "
              f"{'resumed: ' + str(len(out['problems'])) + ' tensors differ after load' if state else 'fresh'}"
              f"{' ' + str(out['problems'][:3]) if out['problems'] else ''}; {time.perf_counter() - t0:.0f} s")
        state, rows = out["state"], rows + out["rows"]
    n = len(rows)
    job = prepare(config(worlds[0], STRATEGIES[worlds[0]], n, "", False), worlds[0])
    planner, _ = make_planner(job)
    ledger = make_ledger(job, open_corpus(job.config, job.spec))
    same_docs = same_counters = 0
    for r in rows:
        ps = planner.next()
        ledger.record_planned(ps)
        same_docs += sorted(r["docs_run"]) == sorted(list(x) for x in ps.docs)
        same_counters += r["data"] == ledger.counters()
    trained = [tuple(x) for r in rows for x in r["docs_run"]]
    print(f"steps with the uninterrupted stream's documents: {same_docs}/{n}; exactly-once counters equal: "
          f"{same_counters}/{n}; sequences trained twice: {len(trained) - len(set(trained))}; "
          f"documents trained: {rows[-1]['data'].get('docs_trained')}")


if __name__ == "__main__":
    main()
