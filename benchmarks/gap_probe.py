"""Where is a step's gap to its bound: in the plan, or in the bound? (issue 9)

For one step of one grid cell (benchmarks/planner_grid.py: same candidates, tokens per step and sources), prints for
every candidate, or the one named by --candidate:

- the planner's estimate (`select.assign`, what `select_step` runs per candidate) and the candidate's bounds: refined
  (`StrategyBound.refined`), mode-aware (`bounds_modes.mode_bound`) and LP-priced (`proof.lp.lp_bound`);
- `s` of the mode relaxation's LP at the best of those bounds (`proof.lp.lp_prices`): s < 0 means the LP is feasible
  there with -s spare pipelines per pipeline, so no certificate of that relaxation can raise the bound;
- the best plan that --restarts seeded random-order dispatches find (`dispatch.restart_dispatch`, --rounds
  local-search rounds each), each packed and polished (`polish.polish`, 400 rounds): a far costlier search than the
  planner's. What it gains over the planner is plan-side gap; what stays between it and the bound is the bound's or
  the heuristics' together, and an exact solver is needed to split it (benchmarks/exact_joint.py on small steps).

Then, per step, the best plan over the candidates against the least bound, planner and restarts: their medians over
the steps say how much of a cell's gap a far costlier plan search could recover.

    python benchmarks/gap_probe.py --model llama-32b --cluster a800x256 --candidates proposal --source github \\
        --seeds 0 --steps 2
    python benchmarks/gap_probe.py --model llama2-13b --cluster a800x16 --source commoncrawl --seeds 0,1,2 --steps 0:10
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_steps

from tidal.planner import select as sel
from tidal.planner.bounds import StrategyBound
from tidal.planner.dispatch import restart_dispatch
from tidal.planner.packing import pack
from tidal.planner.passes import pack_groups
from tidal.planner.polish import polish
from tidal.proof.lp import lp_bound, lp_prices
from tidal.proof.modes import mode_bound


def probe(l_: np.ndarray, prof, restarts: int, rounds: int) -> dict:
    est, _ = sel.assign(l_, prof, seed=0)
    sb = StrategyBound(l_, prof.pipes, arrays=prof.class_arrays)
    refined = sb.refined()
    mode = mode_bound(sb, refined, est)
    lp = lp_bound(sb, max(refined, mode), est)
    bound = max(refined, mode, lp)
    out = lp_prices(bound, sb)
    t0 = time.perf_counter()
    best = est
    for r in range(restarts):
        alt = restart_dispatch(l_, prof.pipes, 1, seed=1000 + r, max_rounds=rounds)
        if alt is None:
            continue
        e2, plans = pack_groups(l_, prof, alt.groups, pack, False)
        e3, _ = polish(l_, prof.pipes, plans, e2, rounds=400)
        best = min(best, e3)
    return {"est": est, "refined": refined, "mode": mode, "lp": lp, "bound": bound,
            "lp_s": None if out is None else out[0], "search": best, "search_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-32b")
    ap.add_argument("--cluster", default="a800x256")
    ap.add_argument("--candidates", choices=["proposal", "hand"], default="proposal")
    ap.add_argument("--source", default="github", help="commoncrawl, github, flanv2 or heavytail")
    ap.add_argument("--seeds", default="0", help="comma-separated")
    ap.add_argument("--steps", default="0", help="comma-separated step indices, or N:M for a range")
    ap.add_argument("--candidate", default=None, help="only this candidate (its name as printed)")
    ap.add_argument("--restarts", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=200, help="local-search rounds per restart")
    args = ap.parse_args(argv)
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}")
    print(f"| seed | step | docs | candidate | planner s | bound s (refined / mode / LP) | planner / bound "
          f"| LP s at the bound | best of {args.restarts} restarts s | restarts / bound | search s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratio, searched = [], []
    for seed, k, l_ in steps:
        rows = []
        for name, prof in zip(names, profs):
            if (args.candidate is not None and name != args.candidate) or int(l_.max()) > prof.max_len:
                continue
            r = probe(l_, prof, args.restarts, args.rounds)
            rows.append(r)
            s = "-" if r["lp_s"] is None else f"{r['lp_s']:+.4f}"
            print(f"| {seed} | {k} | {l_.size} | {name} | {r['est']:.4f} | {r['bound']:.4f} ({r['refined']:.4f} / "
                  f"{r['mode']:.4f} / {r['lp']:.4f}) | {r['est'] / r['bound']:.4f} | {s} | {r['search']:.4f} "
                  f"| {r['search'] / r['bound']:.4f} | {r['search_s']:.1f} |", flush=True)
        if rows:  # the step: best plan over the candidates against the least bound
            lb = min(r["bound"] for r in rows)
            ratio.append(min(r["est"] for r in rows) / lb)
            searched.append(min(r["search"] for r in rows) / lb)
    if ratio:
        print(f"steps: {len(ratio)}; step est / bound median {np.median(ratio):.4f} max {max(ratio):.4f}; "
              f"with the restarts' plans median {np.median(searched):.4f} max {max(searched):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
