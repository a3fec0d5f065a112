"""Resident bytes per rank: the executor's tensor storages measured on gloo ranks (CPU) against the memory model
(costmodel/memory.py `resident_bytes`), for several strategies and candidate-set sizes.

Measured by runtime/resident.py: every live tensor storage of each rank process at the step's pull, backward and
push peaks (activations left out on both sides), for one step of the first strategy of each candidate set.

    python benchmarks/resident_memory.py [--model small] [--world 4] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse

STRATEGIES = ("4*tp1", "2*tp2", "tp4", "tp2pp2", "pp4", "tp1cp2+2*tp1")
SIZES = (1, 2, 4)


def run(model: str, world: int, strategies, sizes, compute: str = "float32", master: str = "float32") -> list:
    """Rows (strategy, candidate-set size, per-rank results)."""
    from tidal.runtime.launch import run_distributed
    from tidal.runtime.resident import measure_worker

    cases, keys = [], []
    for i, s in enumerate(strategies):
        for n in sizes:
            others = [strategies[(i + j) % len(strategies)] for j in range(1, n)]
            cases.append([s, *others])
            keys.append((s, n))
    res = run_distributed(measure_worker, world, model, cases, compute, master, timeout_s=1800)
    return [(s, n, [res[r][c] for r in range(world)]) for c, (s, n) in enumerate(keys)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype (master fp32)")
    args = ap.parse_args()
    from tidal.runtime.resident import worst

    rows = run(args.model, args.world, STRATEGIES, SIZES, compute=args.dtype)
    print(f"# resident bytes per rank, model {args.model}, {args.world} gloo ranks, compute {args.dtype}, master fp32; "
          "MB = 1e6 B; peak = max over ranks and the pull/backward/push phases; err = worst |measured/model - 1| "
          "over ranks and phases; model: resident_bytes with the pull plans' wire bytes of the rank; closed form: "
          "resident_bytes as the planner calls it (no placement)")
    print(f"{'strategy':<14} {'cands':>5} {'measured MB':>12} {'model MB':>9} {'worst err':>9}  {'where':<16} "
          f"{'closed form err':>15}")
    for s, n, ranks in rows:
        mp, md, err, at = worst(ranks)
        cerr = worst(ranks, "closed_form")[2]
        print(f"{s:<14} {n:5d} {mp / 1e6:12.2f} {md / 1e6:9.2f} {100 * err:8.1f}%  {at:<16} {100 * cerr:14.1f}%")


if __name__ == "__main__":
    main()
