"""Planner benchmark: speed, quality (estimate / lower bound), heuristic-vs-exact gaps, comparison with Hydraulis Alg. 1
and token first-fit-decreasing. Prints figures; nothing is asserted.

    python benchmarks/planner.py                 # everything (about 2-4 minutes on 2 cores)
    python benchmarks/planner.py --only speed    # speed | quality | exact | compare | packers | proposal
    python benchmarks/planner.py --grid [--models M,..] [--clusters C,..] [--cands proposal,hand] [--sources S,..]
                                 [--seeds 0,1,2] [--held-out-seeds 10,11,12] [--held-out-sources stdlib]
                                 [--steps 10] [--hy-trials 1] [--budget-ms X] [--prove] [--prove-milp S]
                                 [--prove-pool S [--pool-counts] [--pool-halvings N]] [--prove-forced S
                                 [--forced-kinds G]] [--out grid.json]
                                 [--passes all|none|NAME,..] [--drop NAME,..]
                                 (decision 95)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tidal.baselines.fixed import pack_fixed
from tidal.core import TidalError, get_cluster, get_model, parse_strategy, place
from tidal.costmodel import LatencyCoeffs, default_cost_model
from tidal.data import sample_steps
from tidal.planner.alg1 import dispatch_hydraulis
from tidal.planner.bounds import PipeCost
from tidal.planner.dispatch import dispatch
from tidal.planner.packing import pack
from tidal.planner.select import StrategyProfile, assign, profile_strategies, select_step

MODEL = "llama2-7b"
MAX_LEN = 32768
# Hand-picked candidate sets (used when --candidates=hand); --candidates=proposal uses tidal.planner.proposal.
HAND = {
    "a800x64": ["8*tp8", "16*tp4", "4*tp8+8*tp4", "2*tp8+12*tp4", "2*tp8+8*tp4+8*tp2", "tp8cp2+12*tp4",
                "4*tp4+24*tp2", "4*tp4+8*tp2+32*tp1", "8*tp4pp2", "2*tp8pp2+8*tp4"],
    "a800x1024": ["128*tp8", "256*tp4", "64*tp8+128*tp4", "32*tp8+192*tp4", "32*tp8+128*tp4+128*tp2",
                  "16*tp8cp2+192*tp4", "64*tp4+384*tp2", "64*tp4+128*tp2+512*tp1", "128*tp4pp2",
                  "32*tp8pp2+128*tp4"],
}


def candidates(cluster_name: str, how: str, source: str, tokens: int) -> tuple[list[str], tuple[StrategyProfile, ...]]:
    model, cluster = get_model(MODEL), get_cluster(cluster_name)
    cm = default_cost_model(model, cluster)
    if how == "proposal":
        from tidal.planner.proposal import propose

        lengths = np.concatenate([np.asarray(s.lengths) for s in steps(source, 200_000, 50, seed=99)])
        names = [str(s) for s in propose(lengths, cm, tokens_per_step=tokens, max_len=MAX_LEN).strategies]
    else:
        names = HAND[cluster_name]
    profs = profile_strategies([place(parse_strategy(n), cluster, model) for n in names], cm)
    return names, profs


def steps(source: str, tokens: int, n: int, seed: int = 0):
    return sample_steps(f"synthetic:{source}", seed=seed, tokens_per_step=tokens, max_len=MAX_LEN, steps=n)[0]


def q(xs, p):
    return float(np.quantile(np.asarray(xs, dtype=np.float64), p))


def bench_speed(how: str) -> None:
    print("\n## (a) speed: full per-step plan over all candidates (llama2-7b, 32K max-len, synthetic:commoncrawl)")
    print("| cluster | tokens/step | candidates | seqs/step | median ms | p90 ms | target |")
    print("|---|---|---|---|---|---|---|")
    for cluster, tokens, target in (("a800x64", 200_000, 20), ("a800x1024", 3_200_000, 250)):
        names, profs = candidates(cluster, how, "commoncrawl", tokens)
        ms, ns = [], []
        for st in steps("commoncrawl", tokens, 21, seed=1)[1:]:
            t0 = time.perf_counter()
            select_step(st.lengths_array(), profs, seed=0)
            ms.append((time.perf_counter() - t0) * 1e3)
            ns.append(len(st.lengths))
        print(f"| {cluster} | {tokens:,} | {len(names)} | {int(np.median(ns))} | {np.median(ms):.1f} | {q(ms, .9):.1f} "
              f"| <= {target} |")


def bench_quality(how: str) -> None:
    print("\n## (b) quality: est_step_time / lower_bound (a800x64, 200K tokens/step, 40 steps)")
    print("| source | median | p90 | max | strategies chosen |")
    print("|---|---|---|---|---|")
    for source in ("commoncrawl", "github"):
        names, profs = candidates("a800x64", how, source, 200_000)
        r, chosen = [], {}
        for st in steps(source, 200_000, 40, seed=2):
            p = select_step(st.lengths_array(), profs, seed=0).plan
            r.append(p.est_step_time / p.lower_bound)
            chosen[names[p.strategy]] = chosen.get(names[p.strategy], 0) + 1
        top = ", ".join(f"{k} x{v}" for k, v in sorted(chosen.items(), key=lambda kv: -kv[1])[:3])
        print(f"| {source} | {np.median(r):.4f} | {q(r, .9):.4f} | {max(r):.4f} | {top} |")


def bench_exact() -> None:
    print("\n## (c) heuristic vs exact (HiGHS MILP), 200 small seeded instances each")
    print("| problem | median gap | p90 gap | max gap | heuristic ms (mean) | exact ms (mean) |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    kinds = [PipeCost(1e-3, 1.0, 0.5, 1, 64), PipeCost(0.5e-3, 0.5, 0.5, 2, 128), PipeCost(2e-4, 0.25, 1.0, 4, 200)]
    rows = {"dispatch": [], "packing": [], "two-stage": []}
    for _ in range(200):
        pipes = [kinds[rng.integers(0, 3)] for _ in range(rng.integers(1, 4))]
        lengths = rng.integers(1, max(p.max_len for p in pipes) + 1, size=rng.integers(1, 10))
        t0 = time.perf_counter()
        h = dispatch(lengths, pipes).objective
        t1 = time.perf_counter()
        e = dispatch(lengths, pipes, exact=True).objective
        t2 = time.perf_counter()
        rows["dispatch"].append((h / e - 1 if e else 0.0, t1 - t0, t2 - t1))
        co, pp, ml = LatencyCoeffs(1e-3, 1.0, float(rng.choice([0.2, 2.0]))), int(rng.integers(1, 5)), 128
        lengths = rng.integers(1, 64, size=rng.integers(1, 10))
        t0 = time.perf_counter()
        h = pack(lengths, co, pp, ml).est_time
        t1 = time.perf_counter()
        e = pack(lengths, co, pp, ml, exact=True).est_time
        t2 = time.perf_counter()
        rows["packing"].append((h / e - 1, t1 - t0, t2 - t1))
        prof = _small_profile(pipes)
        lengths = rng.integers(1, prof.max_len + 1, size=rng.integers(1, 9))
        t0 = time.perf_counter()
        h = assign(lengths, prof)[0]
        t1 = time.perf_counter()
        e = assign(lengths, prof, exact=True)[0]
        t2 = time.perf_counter()
        rows["two-stage"].append((h / e - 1, t1 - t0, t2 - t1))
    for k, v in rows.items():
        g = [x[0] for x in v]
        print(f"| {k} | {np.median(g):.4%} | {q(g, .9):.4%} | {max(g):.4%} | {1e3 * np.mean([x[1] for x in v]):.2f} "
              f"| {1e3 * np.mean([x[2] for x in v]):.2f} |")


def _small_profile(pipes) -> StrategyProfile:
    cluster = get_cluster("cpux16")
    schemes = parse_strategy("+".join(f"pp{p.pp}" for p in pipes))
    return StrategyProfile(place(schemes, cluster), tuple(pipes), tuple(s.stage_layers(8) for s in schemes))


def _hydraulis_step(lengths, profs, trials, seed):
    best = float("inf")
    for prof in profs:
        if lengths.max() > prof.max_len:
            continue
        d = dispatch_hydraulis(lengths, prof.pipes, trials=trials, seed=seed)
        est = 0.0
        for g, p in zip(d.groups, prof.pipes):
            if g:
                r = pack(lengths[list(g)], p.coeffs, p.pp, p.max_len)
                est = max(est, r.est_time)
        best = min(best, est)
    return best


def bench_compare(how: str) -> None:
    print("\n## (d) vs Hydraulis Alg. 1 (T shuffles, then our packer) and token FFD packing (our dispatch), "
          "same candidates; commoncrawl")
    print("| cluster | method | median est step s | median est / ours | median plan ms |")
    print("|---|---|---|---|---|")
    for cluster, tokens, n, trials in (("a800x64", 200_000, 10, 100), ("a800x1024", 3_200_000, 3, 2)):
        names, profs = candidates(cluster, how, "commoncrawl", tokens)
        res: dict[str, list[tuple[float, float]]] = {"tidal": [], f"hydraulis-alg1 T={trials}": [], "token-ffd": []}
        for st in steps("commoncrawl", tokens, n, seed=3):
            l_ = st.lengths_array()
            t0 = time.perf_counter()
            ours = select_step(l_, profs).plan.est_step_time
            t1 = time.perf_counter()
            hy = _hydraulis_step(l_, profs, trials, 0)
            t2 = time.perf_counter()
            ffd = select_step(l_, profs, packer=pack_fixed).plan.est_step_time
            t3 = time.perf_counter()
            res["tidal"].append((ours, t1 - t0))
            res[f"hydraulis-alg1 T={trials}"].append((hy, t2 - t1))
            res["token-ffd"].append((ffd, t3 - t2))
        base = np.array([x[0] for x in res["tidal"]])
        for k, v in res.items():
            e = np.array([x[0] for x in v])
            print(f"| {cluster} | {k} | {np.median(e):.3f} | {np.median(e / base):.3f} | "
                  f"{1e3 * np.median([x[1] for x in v]):.0f} |")


def bench_packers() -> None:
    print("\n## (f) packers on fixed PP > 1 strategies (a800x64, 200K tokens/step, 10 steps, same dispatch)")
    print("| strategy | source | tidal pack: median est s | token-FFD / tidal (median) | token-FFD / tidal (max) |")
    print("|---|---|---|---|---|")
    model, cluster = get_model(MODEL), get_cluster("a800x64")
    cm = default_cost_model(model, cluster)
    for name in ("8*tp4pp2", "4*tp4pp4", "2*tp8pp4"):
        prof = profile_strategies([place(parse_strategy(name), cluster, model)], cm)[0]
        for source in ("commoncrawl", "github"):
            ours, ffd = [], []
            for st in steps(source, 200_000, 10, seed=4):
                l_ = st.lengths_array()
                if l_.max() > prof.max_len:
                    continue
                ours.append(assign(l_, prof)[0])
                ffd.append(assign(l_, prof, packer=pack_fixed)[0])
            r = np.array(ffd) / np.array(ours)
            print(f"| {name} | {source} | {np.median(ours):.3f} | {np.median(r):.3f} | {r.max():.3f} |")


def bench_proposal() -> None:
    from tidal.planner.proposal import propose

    print("\n## (e) strategy proposal (llama2-7b, 32K max-len)")
    print("| cluster | source | time s | candidates |")
    print("|---|---|---|---|")
    for cluster, tokens in (("a800x64", 200_000), ("a800x1024", 3_200_000)):
        cm = default_cost_model(get_model(MODEL), get_cluster(cluster))
        for source in ("commoncrawl", "github"):
            lengths = np.concatenate([np.asarray(s.lengths) for s in steps(source, 200_000, 50, seed=99)])
            t0 = time.perf_counter()
            prop = propose(lengths, cm, tokens_per_step=tokens, max_len=MAX_LEN)
            dt = time.perf_counter() - t0
            print(f"| {cluster} | {source} | {dt:.2f} | {'; '.join(str(s) for s in prop.strategies)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["speed", "quality", "exact", "compare", "packers", "proposal"])
    ap.add_argument("--candidates", choices=["hand", "proposal"], default="proposal")
    ap.add_argument("--grid", action="store_true", help="worst-case grid (benchmarks/planner_grid.py)")
    ap.add_argument("--models", default="llama2-7b,llama2-13b,llama-32b")
    ap.add_argument("--clusters", default="a800x16,a800x32,a800x64,a800x256,a800x1024")
    ap.add_argument("--cands", default="proposal,hand")
    ap.add_argument("--sources", default="commoncrawl,github,flanv2,heavytail")
    ap.add_argument("--seeds", default="0,1,2", help="grid: the tuning seeds (every constant was chosen on 0,1,2)")
    ap.add_argument("--held-out-seeds", default="10,11,12", help="grid: held-out seeds ('' for none)")
    ap.add_argument("--held-out-sources", default="stdlib", help="grid: held-out sources, on the held-out seeds only")
    ap.add_argument("--steps", type=int, default=10, help="grid: steps per seed")
    ap.add_argument("--hy-trials", type=int, default=1, help="grid: dispatch_hydraulis shuffles (0: no column)")
    ap.add_argument("--hy-max-devices", type=int, default=1024, help="grid: hydraulis column up to this cluster size")
    ap.add_argument("--budget-ms", type=float, default=None, help="grid: per-step planning budget")
    ap.add_argument("--out", default=None, help="grid: write the rows as JSON")
    ap.add_argument("--passes", default="all", help="grid: the improvement passes to run (names from "
                    "config.PASS_ORDER, comma-separated; 'all' or 'none'; decision 95's ablation)")
    ap.add_argument("--drop", default="", help="grid: passes to leave out (comma-separated names)")
    ap.add_argument("--prove", action="store_true",
                    help="grid: est/lb against the LP-priced bound (proof.lp.prove_selection, timed apart)")
    ap.add_argument("--prove-milp", type=float, default=0.0, metavar="S",
                    help="grid, with --prove: also the MILP bound (proof.milp.milp_bound, S seconds per HiGHS solve; "
                    "steps of <= 5000 documents x pipelines; decision 108)")
    ap.add_argument("--prove-pool", type=float, default=0.0, metavar="S",
                    help="grid, with --prove: also the pooled MILP bound (proof.pool.pool_bound, S seconds per HiGHS "
                    "solve; steps of hundreds of documents; decision 118)")
    ap.add_argument("--pool-counts", action="store_true",
                    help="grid, with --prove-pool: the pooled MILP with its micro-batch count rows and the compact "
                    "one-stage encoding (decision 123)")
    ap.add_argument("--pool-halvings", type=int, default=None, metavar="N",
                    help="grid, with --prove-pool: the pooled MILP's bisection halvings (pool_bound's iters; default "
                    "4; decision 127)")
    ap.add_argument("--prove-forced", type=float, default=0.0, metavar="S",
                    help="grid, with --prove: also the forced-document MILP bound before the pooled one "
                    "(proof.forced.forced_bound, S seconds per HiGHS solve, --pool-halvings halvings; decision 145)")
    ap.add_argument("--forced-kinds", type=float, default=0.0, metavar="G",
                    help="grid, with --prove-forced: then the forced MILP's per-kind form with its dual feasible "
                    "function rows, first at plan / (1 + G) (prove_selection's forced_kinds; 0.0099: is the plan "
                    "within 1 %% of every plan; decision 153)")
    a = ap.parse_args()
    if a.forced_kinds != 0 and not (0 < a.forced_kinds < 1 and a.prove_forced > 0):
        ap.error(f"--forced-kinds takes a gap in (0, 1) and needs --prove-forced S > 0; got {a.forced_kinds}, "
                 f"--prove-forced {a.prove_forced}")
    if not (a.prove_milp >= 0 and a.prove_pool >= 0 and a.prove_forced >= 0):
        ap.error(f"--prove-milp, --prove-pool and --prove-forced take seconds >= 0 (0: off); got {a.prove_milp}, "
                 f"{a.prove_pool}, {a.prove_forced}")
    if a.pool_halvings is not None and not (a.pool_halvings >= 0 and (a.prove_pool > 0 or a.prove_forced > 0)):
        ap.error(f"--pool-halvings takes an integer >= 0 and needs --prove-pool or --prove-forced S > 0; got "
                 f"{a.pool_halvings}, --prove-pool {a.prove_pool}, --prove-forced {a.prove_forced}")
    a.pool_halvings = 4 if a.pool_halvings is None else a.pool_halvings
    if a.grid:
        import planner_grid

        try:
            planner_grid.main(a)
        except TidalError as e:  # bad input (unknown model, pass, seeds ...): one line, not a traceback
            ap.error(str(e))
        return
    print(f"candidates: {a.candidates}")
    for name, fn in (("speed", lambda: bench_speed(a.candidates)), ("quality", lambda: bench_quality(a.candidates)),
                     ("exact", bench_exact), ("compare", lambda: bench_compare(a.candidates)),
                     ("packers", bench_packers), ("proposal", bench_proposal)):
        if a.only in (None, name):
            fn()


if __name__ == "__main__":
    main()
