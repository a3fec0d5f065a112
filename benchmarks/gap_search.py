"""Plan side of a step's gap, per candidate: is there a faster plan than the planner's? (issue 27, decision 130)

For each step of one grid cell (planner_grid.probe_steps): the step's plan (`select_step`, seed 0, the default
config) and its LP-proven bound (`proof.lp.prove_selection`), with each candidate's proven bound. Then, on every
candidate whose bound is under the step's plan (only those can hold a faster plan; `--min-gap G`: under plan / (1 + G)):
  * alone: `select_step` with that candidate as the only profile (the planner's plan for it);
  * search: `assign` on it with `--restarts` seeds and a config that spends much more than the planner's
    (`search_config`: late random-order restarts with the full local search at any size, no allowance limits,
    polish 200 rounds over 64 partners, shrink and fill without per-step limits), the best kept;
  * lns: from the best so far, `gap_lns.search` (decision 123: the slowest pipeline and `--k` others re-dispatched by
    a HiGHS MILP, `--lns-rounds` moves, `--time-limit` s each), one-stage candidates only, then `search_long` (the
    slowest and `--k-long` random pipelines that can hold its longest document, as many moves), then the dispatch's
    local search (`dispatch.owner_result`, 200 rounds) from it; the fastest of the three. Every plan is evaluated
    the same way: the planner's packer on each group (`passes.pack_groups`)
    and the candidate's charges (`charges.charge`).
Prints, relative to the step's plan: the candidate's bound (plan / bound), alone / plan, search / plan, lns / plan,
and the best over the candidates ("< 1": a faster plan, so that part of the step's gap is the plan's).

    cd benchmarks && python gap_search.py --model llama2-7b --cluster a800x256 --source github --seeds 10 --steps 0:3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gap_lns import packed, regroup, search
from planner_grid import probe_args, probe_steps

from tidal.planner.charges import charge
from tidal.planner.config import PlannerConfig
from tidal.planner.dispatch import owner_result
from tidal.planner.packing import pack
from tidal.planner.passes import pack_groups
from tidal.planner.select import assign, select_step
from tidal.proof.lp import prove_selection


def search_config() -> PlannerConfig:
    """Much more search than PlannerConfig(): late restarts (6 of 200 rounds; 3 with the full local search on the
    largest steps) at any size above restart_max, polish 200 rounds over 64 partners, no pass skipped for its gap."""
    return PlannerConfig(late_restarts=6, late_rounds=200, late_restart_max=2**22, late_restart_max_big=2**22,
                         late_big_restarts=3, late_gap=0.0, late_gap_big=0.0, polish_rounds=200, polish_light=64,
                         shrink_per_step=64, fill_per_step=64, late_per_step=64, fill_gap=0.0, shrink_gap=0.0)


def evaluate(l_: np.ndarray, prof, groups, plans_out: list | None = None) -> float:
    """Step time of `groups` on candidate `prof`: packed by the planner's packer, with the candidate's charges;
    checked first: every document in exactly one group, none longer than its pipeline's MaxLen. `plans_out`: gets
    the per-pipeline plans appended."""
    got = np.sort(np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]))
    if not np.array_equal(got, np.arange(l_.size)) or any(
            g and int(l_[list(g)].max()) > p.max_len for g, p in zip(groups, prof.pipes)):
        raise AssertionError("not a dispatch of the step's documents")
    est, plans = pack_groups(l_, prof, [list(g) for g in groups], pack, False)
    if prof.charges is not None:
        est, plans = charge(l_, prof.pipes, prof.charges, plans)
    if plans_out is not None:
        plans_out.extend(plans)
    return est


def changes(name: str, before, after) -> str:
    """What differs between two plans of one candidate: how many pipelines got other documents, by kind (the
    strategy's pipelines in the order `name` lists them), on how many the micro-batch count changed, and the
    documents that moved (in one plan's group of a pipeline, not the other's)."""
    kinds = [kk.split("*")[-1] for kk in name.split("+") for _ in range(int(kk.split("*")[0]) if "*" in kk else 1)]
    if len(kinds) != len(before):
        kinds = [f"pipeline {j}" for j in range(len(before))]
    by_kind: dict[str, int] = {}
    moved, vs = 0, 0
    for j, (a, b) in enumerate(zip(before, after)):
        ga, gb = {i for mb in a.micro_batches for i in mb}, {i for mb in b.micro_batches for i in mb}
        if ga != gb:
            by_kind[kinds[j]] = by_kind.get(kinds[j], 0) + 1
            moved += len(gb - ga)
            vs += len(a.micro_batches) != len(b.micro_batches)
    return (f"{sum(by_kind.values())} of {len(before)} pipelines changed ("
            + ", ".join(f"{v} {kk}" for kk, v in by_kind.items()) + f"), {moved} documents moved, micro-batch count "
            f"changed on {vs}; most micro-batches on a pipeline before / after: "
            f"{max(len(a.micro_batches) for a in before)} / {max(len(b.micro_batches) for b in after)}")


def groups_of(plans) -> list[list[int]]:
    return [[i for mb in p.micro_batches for i in mb] for p in plans]


def best_search(l_, prof, bound: float, restarts: int, cfg: PlannerConfig):
    """The fastest of `restarts` seeded `assign` runs with `cfg` (target: the candidate's bound): (time, groups)."""
    best = (float("inf"), None)
    for s in range(restarts):
        _, plans = assign(l_, prof, seed=s, target=bound, config=cfg)
        t = evaluate(l_, prof, groups_of(plans))
        if t < best[0]:
            best = (t, groups_of(plans))
    return best


def search_long(l_, pipes, groups, k: int, rounds: int, limit: float, rng):
    """LNS whose neighbourhood is the slowest pipeline and `k` random others that can hold its longest document
    (gap_lns.search frees the fastest or random ones, often short-MaxLen pipelines that cannot take the slowest
    pipeline's documents): each re-dispatched by gap_lns.regroup, kept if their largest packed time drops."""
    groups = [list(g) for g in groups]
    times = [packed(l_, g, p)[0] for g, p in zip(groups, pipes)]
    for _ in range(rounds):
        j0 = int(np.argmax(times))
        longest = int(l_[groups[j0]].max())
        elig = [j for j, p in enumerate(pipes) if j != j0 and p.max_len >= longest]
        if not elig:
            break
        S = [j0] + [int(j) for j in rng.choice(elig, size=min(k, len(elig)), replace=False)]
        new = regroup(l_, [i for j in S for i in groups[j]], [pipes[j] for j in S], limit)
        if new is None:
            continue
        nt = [packed(l_, g, pipes[j])[0] for g, j in zip(new, S)]
        if max(nt) < max(times[j] for j in S) * (1 - 1e-9):
            for g, j, t in zip(new, S, nt):
                groups[j], times[j] = g, t
    return groups


def lns(l_, prof, groups, k: int, rounds: int, limit: float, seed: int, k_long: int):
    """gap_lns.search from `groups` (one-stage candidates), then search_long (`k_long`, as many rounds), then
    owner_result's local search; the fastest of the three stages: (time, groups, which stage: "k", "long" or "ls";
    the earliest stage on a tie)."""
    pipes = list(prof.pipes)
    if any(p.pp != 1 or p.eq1 for p in pipes):
        return float("nan"), groups, ""
    rng = np.random.default_rng(seed)
    new, _, _ = search(l_, pipes, groups, k, rounds, limit, rng, False, 0.0)
    new2 = search_long(l_, pipes, new, k_long, rounds, limit, rng) if k_long else new
    owner = np.empty(l_.size, dtype=np.int64)
    for j, g in enumerate(new2):
        owner[g] = j
    ls = [list(g) for g in owner_result(l_, prof.pipes, owner, 200).groups]
    return min(((evaluate(l_, prof, g), g, w) for g, w in ((new, "k"), (new2, "long"), (ls, "ls"))),
               key=lambda x: x[0])


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-7b", "a800x256", "github", "10", "0:3")
    ap.add_argument("--restarts", type=int, default=8, help="seeds of the search's assign per candidate")
    ap.add_argument("--k", type=int, default=3, help="LNS: pipelines freed beside the slowest")
    ap.add_argument("--lns-rounds", type=int, default=20, help="LNS moves per candidate (0: no LNS)")
    ap.add_argument("--k-long", type=int, default=6,
                    help="LNS, second stage: pipelines freed beside the slowest among those that can hold its longest "
                         "document (0: no second stage)")
    ap.add_argument("--time-limit", type=float, default=5.0, help="LNS: seconds per MILP")
    ap.add_argument("--min-gap", type=float, default=0.0,
                    help="search only candidates with step plan / their LP bound above 1 + this (0: every candidate "
                         "whose bound is under the step's plan; 0.01 skips one within 1 %% of it, decision 147)")
    args = ap.parse_args(argv)
    if args.restarts < 1 or args.k < 1 or args.lns_rounds < 0 or args.k_long < 0 or not args.time_limit > 0:
        ap.error("--restarts and --k must be >= 1, --lns-rounds and --k-long >= 0 and --time-limit > 0")
    if not args.min_gap >= 0:
        ap.error("--min-gap must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    cfg = search_config()
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: {len(names)} candidates; restarts "
          f"{args.restarts}, LNS k {args.k} then k-long {args.k_long}, {args.lns_rounds} rounds each, "
          f"{args.time_limit} s per MILP")
    print("| seed | step | docs | candidate | plan / its bound | alone / plan | search / plan | lns / plan "
          "| s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, k, l_ in steps:
        sel = prove_selection(l_, profs, select_step(l_, profs, seed=0))
        plan = sel.plan.est_step_time
        print(f"| {seed} | {k} | {l_.size} | step: {names[sel.plan.strategy]} | {plan / sel.plan.lower_bound:.4f} "
              f"| 1 | | | |", flush=True)
        best_all, diffs = float("inf"), []
        for i, rep in enumerate(sel.strategies):
            b = rep.lower_bound
            if b is None or not b * (1 + args.min_gap) < plan or int(l_.max()) > profs[i].max_len:
                continue
            t0 = time.perf_counter()
            mine = select_step(l_, [profs[i]], seed=0).plan
            alone = mine.est_step_time
            found, groups = best_search(l_, profs[i], b, args.restarts, cfg)
            t1 = time.perf_counter()
            lt, g2, how = float("nan"), groups, ""
            if args.lns_rounds:
                lt, g2, how = lns(l_, profs[i], groups, args.k, args.lns_rounds, args.time_limit, seed * 100 + k,
                             args.k_long)
            t2 = time.perf_counter()
            top = min(found, lt if lt == lt else float("inf"))
            if top < alone * (1 - 5e-3):
                after: list = []
                evaluate(l_, profs[i], g2 if top == lt else groups, after)
                diffs.append(f"{names[i]}: {changes(names[i], mine.pipelines, after)}")
            best_all = min(best_all, alone, top)
            print(f"| {seed} | {k} | {l_.size} | {names[i]} | {plan / b:.4f} | {alone / plan:.4f} "
                  f"| {found / plan:.4f} | {lt / plan:.4f} {how} | {t1 - t0:.0f} + {t2 - t1:.0f} |", flush=True)
        print(f"| {seed} | {k} | {l_.size} | best over candidates | | | | **{best_all / plan:.4f}** | |", flush=True)
        for d in diffs:
            print(f"#   seed {seed} step {k}, best found against the planner's plan for {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
