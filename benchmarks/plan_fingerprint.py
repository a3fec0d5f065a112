"""Plan fingerprints: has a planner change altered any plan? (issue 27: refactors must keep plans byte-identical)

    python benchmarks/plan_fingerprint.py --out before.json [--no-numba] [--steps 8]
    python benchmarks/plan_fingerprint.py --out after.json
    python benchmarks/plan_fingerprint.py --compare before.json after.json
    python benchmarks/plan_fingerprint.py --cands proposal --cells llama2-7b:a800x1024:github --steps 3 --out p.json

Each record is one seeded step of one grid cell (hand candidates; the same cells as decision 89's check:
llama2-13b a800x16 commoncrawl, llama2-7b a800x64 flanv2, llama-32b a800x256 github, plus llama2-7b a800x16 heavytail
and stdlib): select_step's plan (StepPlan.to_dict without plan_ms; with --no-bound also without lower_bound), hashed.
`--no-numba` hides numba (sys.modules["numba"] = None) so the plain-Python source runs; both modes must give the same
hashes. Prints the
record count and, with --compare, every record that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

CELLS = (("llama2-13b", "a800x16", "commoncrawl"), ("llama2-7b", "a800x64", "flanv2"),
         ("llama-32b", "a800x256", "github"), ("llama2-7b", "a800x16", "heavytail"),
         ("llama2-7b", "a800x16", "stdlib"))


def fingerprints(steps: int, seeds: list[int], bound: bool = True, cands: str = "hand",
                 cells: tuple = CELLS) -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from planner_grid import MAX_LEN, TOKENS, Grid

    from tidal.core import get_cluster
    from tidal.data import sample_steps
    from tidal.planner.select import select_step

    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        grid = Grid(Path(tmp))
        for model, cluster, source in cells:
            _, profs, _ = grid.candidates(model, cluster, cands, source)
            tokens = TOKENS[get_cluster(cluster).num_devices]
            for seed in seeds:
                sts = sample_steps(grid.specs[source], seed=seed, tokens_per_step=tokens, max_len=MAX_LEN,
                                   steps=steps)[0]
                for k, st in enumerate(sts):
                    plan = select_step(st.lengths_array(), profs, seed=0).plan
                    d = plan.to_dict(timings=False)
                    if not bound:
                        d.pop("lower_bound")
                    blob = json.dumps(d, sort_keys=True).encode()
                    key = f"{model}/{cluster}/{cands}/{source}/seed{seed}/step{k}"
                    out[key] = hashlib.sha256(blob).hexdigest()[:16]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the fingerprints (JSON) here")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", default="0,10")
    ap.add_argument("--no-numba", action="store_true", help="hide numba: run the plain-Python source")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--no-bound", action="store_true", help="hash the plans without their lower bound (decision 102: "
                    "a change that only tightens the reported bound)")
    ap.add_argument("--cands", choices=("hand", "proposal"), default="hand", help="candidate strategies (proposal: "
                    "the strategy proposal's, as the grid's proposal cells)")
    ap.add_argument("--cells", help="MODEL:CLUSTER:SOURCE,... instead of the five default cells")
    a = ap.parse_args()
    if a.compare:
        b, c = (json.loads(Path(p).read_text()) for p in a.compare)
        diff = sorted(k for k in b.keys() | c.keys() if b.get(k) != c.get(k))
        for k in diff:
            print(f"differs: {k}  {b.get(k)} -> {c.get(k)}")
        print(f"{len(b)} / {len(c)} records, {len(diff)} differ")
        sys.exit(1 if diff else 0)
    if a.no_numba:
        sys.modules["numba"] = None  # type: ignore[assignment]
    cells = tuple(tuple(c.split(":")) for c in a.cells.split(",")) if a.cells else CELLS
    if any(len(c) != 3 for c in cells):
        sys.exit(f"--cells: expected MODEL:CLUSTER:SOURCE,..., got {a.cells!r}")
    fp = fingerprints(a.steps, [int(s) for s in a.seeds.split(",")], bound=not a.no_bound, cands=a.cands,
                      cells=cells)
    print(f"{len(fp)} records")
    if a.out:
        Path(a.out).write_text(json.dumps(fp, indent=0, sort_keys=True))


if __name__ == "__main__":
    main()
