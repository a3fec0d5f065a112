"""Where does Tidal lose time in one Hydraulis Fig. 13 cell? (decision 103)

Per simulated step: the strategy Tidal ran, its charged estimate and simulated time; the least charged estimate
(select.assign + charges.charge, as the proposal evaluates) among Tidal's candidates and among a much larger pool
(Tidal's candidates and every strategy within `--levels` neighbour moves of them, proposal_search.neighbours with
4-way splits and merges: a per-step oracle over that pool); Hydraulis' strategy and simulated time. With `--plain`
also Tidal with the plain (non-refined) proposal, per step. Same workload as benchmarks/paper_tables.py's cell.

    python benchmarks/fig13_headroom.py llama2-13b 32 F1 commoncrawl --seed 1 [--plan pool|analytic] [--plain]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from _simcommon import workload
from paper_tables import FS, _spec

from tidal.core.errors import TidalError
from tidal.core.strategy import place
from tidal.planner.proposal import scheme_space
from tidal.planner.proposal_search import ProfileCache, evaluate, neighbours
from tidal.planner.stepper import build_candidates
from tidal.simulator import systems as S
from tidal.simulator.engine import SimConfig
from tidal.simulator.runs import steps_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("gpus", type=int)
    ap.add_argument("f", choices=[f for f, _, _ in FS])
    ap.add_argument("data", choices=("commoncrawl", "github"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--plan", choices=("pool", "analytic"), default="pool")
    ap.add_argument("--levels", type=int, default=2)
    ap.add_argument("--plain", action="store_true", help="also Tidal with the plain (non-refined) proposal")
    a = ap.parse_args()
    _, max_len, tokens = next(x for x in FS if x[0] == a.f)
    w = workload(a.model, f"a800x{a.gpus}", f"synthetic:{a.data}", max_len, tokens, a.steps, a.seed,
                 cost_model=_spec(a.plan, a.model), truth=_spec("pool", a.model))
    sim, cm = SimConfig(), w.cost_model
    n_dev = cm.cluster.num_devices
    space = scheme_space(cm, max_tp=min(S.HYDRAULIS_MAX_TP, n_dev))
    runs = {}
    for refine in (True, False) if a.plain else (True,):
        t0 = time.process_time()
        cands = build_candidates(cm, "auto", w.sample_lengths, tokens_per_step=w.tokens_per_step, max_len=max_len,
                                 seed=w.seed, sync=sim.sync, cp_policy="adaptive", schemes=space, refine=refine)
        cpu = time.process_time() - t0
        w2 = dataclasses.replace(w, tidal=(cands, S._options(w, packing="hydraulis", cp_sharding="adaptive")))
        runs[refine] = (cands, S.run_system("tidal", w2, sim))
        print(f"tidal {'refine' if refine else 'plain'} (proposal {cpu:.1f} s CPU): {' ; '.join(map(str, cands))}")
    cands, r = runs[True]
    hyd = S.run_system("hydraulis", w, sim)
    idx = {s: k for k, s in enumerate(space)}

    def combo(st):
        return tuple(sorted((idx[p.scheme] for p in st.pipelines), key=lambda k: (-space[k].num_devices, k)))

    seen = {combo(c) for c in cands}
    front = set(seen)
    for _ in range(a.levels):
        front = {c2 for c in front for c2 in neighbours(c, space, n_dev, (2, 4))} - seen
        seen |= front
    big = []
    for c in sorted(seen):
        try:
            big.append(place(tuple(space[k] for k in c), cm.cluster, cm.model))
        except TidalError:
            continue
    steps = [np.asarray(s, dtype=np.int64) for s in steps_of(w.source_factory(), a.steps)]
    cache = ProfileCache(cm, sim.sync, "adaptive")
    t0 = time.process_time()
    E = evaluate(steps, big, cache, a.seed)
    Ec = evaluate(steps, list(cands), cache, a.seed)
    print(f"larger pool: {len(big)} strategies within {a.levels} moves, evaluated in {time.process_time() - t0:.0f} s"
          f" CPU")
    for s in range(len(steps)):
        b = int(np.argmin(E[:, s]))
        line = (f"step {s}: tidal {r.strategies[s]:<30} est {r.est_times[s]:.3f} sim {r.step_times[s]:.3f} | "
                f"candidates' least est {Ec[:, s].min():.3f} | larger pool's {E[b, s]:.3f} ({big[b]}) | "
                f"hydraulis {hyd.strategies[s]} {hyd.step_times[s]:.3f}")
        if False in runs:
            pr = runs[False][1]
            line += f" | plain {pr.strategies[s]} est {pr.est_times[s]:.3f} sim {pr.step_times[s]:.3f}"
        print(line)
    print(f"mean step: tidal sim {np.mean(r.step_times):.3f} (est {np.mean(r.est_times):.3f}); candidates' least est "
          f"{Ec.min(axis=0).mean():.3f}; larger pool's least est {E.min(axis=0).mean():.3f}; hydraulis sim "
          f"{np.mean(hyd.step_times):.3f}" + (f"; plain sim {np.mean(runs[False][1].step_times):.3f}"
                                              if False in runs else ""))


if __name__ == "__main__":
    main()
