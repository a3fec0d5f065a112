"""A cheap "forced documents first" dispatch for one-stage candidates (issue 27, decision 149): does it find plans
faster than the planner's? A prototype and its measurement, not a planner pass.

Decision 145's forced-document MILP (proof/forced.py) showed faster plans on the 1024-GPU mixed candidates
(`tp4cp8+...+686*tp1`): the documents too long for the short-MaxLen kinds at a target T ("forced": l > MaxLen or
c + w(l) > T on some kind) set the step time where today's plan leaves them alone on a pipeline. Here, MILP-free, for
every one-stage candidate (PP = 1) of each step of one grid cell and T = the step's plan / (1 + x), x = 0, --step,
... up to --xmax, until the forced packing fails:
  1. the forced documents, longest first (rule mc: those that fit the fewest pipelines first), each onto a pipeline
     where its relaxed one-stage time ceil(tokens / MaxLen) c + W stays <= T and it fits MaxLen: rule bf / mc the
     pipeline with the least slack left (best fit), wf the most (worst fit), ff the first by current slack;
  2. every other document, longest first, onto the pipeline whose relaxed time after it is least (LPT, MaxLen kept);
  3. packed by the planner's packer and charged (gap_search.evaluate, which checks the dispatch: each document once,
     none over its pipeline's MaxLen).
--bisect TOL: the cheap form instead: bisect x on the forced documents' packing alone, then steps 2-3 once.
Prints per step and candidate the step's plan / the best prototype plan per rule ("> 1": faster than today's plan),
the x where it was found and the CPU; --out appends one JSON line per step and candidate.

    cd benchmarks && python gap_forced.py --model llama2-7b --cluster a800x64 --source github --seeds 0 --steps 1
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from gap_search import evaluate
from planner_grid import probe_args, probe_steps

from tidal.planner.select import select_step

RULES = ("bf", "mc", "wf", "ff")


def lpt_fill(rest: np.ndarray, l_: np.ndarray, M: np.ndarray, c: np.ndarray, coef: np.ndarray, tok: np.ndarray,
             w: np.ndarray, owner: np.ndarray) -> None:
    """Step 2: each document of `rest` (longest first) onto the pipeline whose relaxed time after it is least (the
    first such; MaxLen kept); updates tok, w and owner in place. Plain Python here, compiled by `_compiled`."""
    for i in rest:
        x = l_[i]
        fx = float(x)
        best, bj = np.inf, -1
        for j in range(M.size):
            if M[j] < x:
                continue
            t = max(1, -(-(tok[j] + x) // M[j])) * c[j] + w[j] + (coef[j, 0] * (fx * fx) + coef[j, 1] * fx + coef[j, 2])
            if t < best:
                best, bj = t, j
        owner[i] = bj
        tok[bj] += x
        w[bj] += coef[bj, 0] * (fx * fx) + coef[bj, 1] * fx + coef[bj, 2]


def _compiled():
    from tidal.planner.kernels import AVAILABLE, njit
    return njit(cache=False)(lpt_fill) if AVAILABLE else lpt_fill


FILL = _compiled()  # numba compiles it on its first call


def forced_first(l_: np.ndarray, pipes, T: float, rule: str, forced_only: bool = False) -> list[list[int]] | None:
    """The dispatch at target T (groups of document indices per pipeline), or None when some forced document fits no
    pipeline within T; `forced_only`: the forced documents' packing alone (the others not placed). Only the forced
    documents are priced on every pipeline (the fit test is per kind); the fill is compiled where numba is."""
    M = np.array([p.max_len for p in pipes], dtype=np.int64)
    c = np.array([p.c for p in pipes])
    coef = np.array([[p.a, p.b, p.d] for p in pipes])
    order = np.argsort(-l_, kind="stable")
    x_ = l_[order].astype(np.float64)
    kinds = list(dict.fromkeys(pipes))
    fits_k = np.ones(l_.size, dtype=bool)
    for p in kinds:
        fits_k &= (x_ <= p.max_len) & (p.c + (p.a * (x_ * x_) + p.b * x_ + p.d) <= T)
    nf = int(np.count_nonzero(~fits_k))  # forced: the longest documents (work grows with length)
    xf = x_[:nf, None]
    wall = coef[None, :, 0] * (xf * xf) + coef[None, :, 1] * xf + coef[None, :, 2]
    fits = (xf <= M[None, :]) & (c[None, :] + wall <= T)
    tok = np.zeros(len(pipes), dtype=np.int64)
    w = np.zeros(len(pipes))
    owner = np.full(l_.size, -1, dtype=np.int64)
    seq = sorted(range(nf), key=lambda r: (int(fits[r].sum()), r)) if rule == "mc" else range(nf)
    for r in seq:
        i, x = int(order[r]), int(x_[r])
        after = np.maximum(1, -(-(tok + x) // M)) * c + w + wall[r]
        ok = (x <= M) & (after <= T)
        if not ok.any():
            return None
        slack = np.where(ok, T - after, np.nan)
        if rule in ("bf", "mc"):
            j = int(np.nanargmin(slack))
        elif rule == "wf":
            j = int(np.nanargmax(slack))
        else:
            cur = T - (np.where(tok > 0, np.maximum(1, -(-tok // M)) * c, 0.0) + w)
            cand = np.flatnonzero(ok)
            j = int(cand[np.argsort(-cur[cand], kind="stable")[0]])
        owner[i] = j
        tok[j] += x
        w[j] += wall[r, j]
    if not forced_only:
        FILL(order[nf:].astype(np.int64), l_.astype(np.int64), M, c, coef, tok, w, owner)
    groups: list[list[int]] = [[] for _ in pipes]
    for i in order:
        if owner[i] >= 0:
            groups[int(owner[i])].append(int(i))
    return groups


def scan(l_: np.ndarray, prof, plan: float, rule: str, step: float, xmax: float) -> tuple[float, float | None, int]:
    """The best evaluated prototype plan over x = 0, step, ... (stopping where the forced packing fails): (its
    estimate or inf, its x, how many targets were tried)."""
    best, bx, n = np.inf, None, 0
    for x in np.arange(0.0, xmax + 1e-12, step):
        n += 1
        g = forced_first(l_, list(prof.pipes), plan / (1 + x), rule)
        if g is None:
            break
        t = evaluate(l_, prof, g)
        if t < best:
            best, bx = t, round(float(x), 6)
    return best, bx, n


def bisect(l_: np.ndarray, prof, plan: float, rule: str, xmax: float, tol: float) -> tuple[float, float | None, int]:
    """The cheap form: bisect x in [0, xmax] (to `tol`) on whether the forced documents alone pack within
    plan / (1 + x), then one whole dispatch, packed and charged, at the largest such x. As `scan`'s result."""
    pipes = list(prof.pipes)
    if forced_first(l_, pipes, plan, rule, True) is None:
        return np.inf, None, 1
    lo, hi, n = 0.0, xmax, 1
    if forced_first(l_, pipes, plan / (1 + hi), rule, True) is not None:
        lo = hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        n += 1
        if forced_first(l_, pipes, plan / (1 + mid), rule, True) is None:
            hi = mid
        else:
            lo = mid
    return evaluate(l_, prof, forced_first(l_, pipes, plan / (1 + lo), rule)), round(lo, 6), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    probe_args(ap, "llama2-7b", "a800x64", "github", "0", "0:2")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--step", type=float, default=0.001)
    ap.add_argument("--xmax", type=float, default=0.04)
    ap.add_argument("--bisect", type=float, default=0.0, metavar="TOL",
                    help="the cheap form (`bisect`) to this tolerance on x instead of the scan")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not (set(a.rules.split(",")) <= set(RULES) and a.step > 0 and a.xmax >= 0 and a.bisect >= 0):
        ap.error(f"--rules must name some of {', '.join(RULES)}; --step > 0, --xmax and --bisect >= 0")
    names, profs, steps = probe_steps(a.model, a.cluster, a.candidates, a.source, a.seeds, a.steps)
    for seed, k, l_ in steps:
        c0 = time.process_time()
        sel = select_step(l_, profs, seed=0)
        plan_cpu = time.process_time() - c0
        plan = sel.plan.est_step_time
        for ci, prof in enumerate(profs):
            if any(p.q != 0 for p in prof.pipes):
                continue
            rec = {"model": a.model, "cluster": a.cluster, "source": a.source, "seed": seed, "step": k,
                   "cand": names[ci], "chosen": names[sel.plan.strategy], "plan": plan, "plan_cpu": plan_cpu}
            for rule in a.rules.split(","):
                c0 = time.process_time()
                best, bx, n = (bisect(l_, prof, plan, rule, a.xmax, a.bisect) if a.bisect > 0
                               else scan(l_, prof, plan, rule, a.step, a.xmax))
                rec[rule] = {"ratio": plan / best if np.isfinite(best) else None, "x": bx, "targets": n,
                             "cpu": time.process_time() - c0}
            rs = [rec[r]["ratio"] for r in a.rules.split(",") if rec[r]["ratio"] is not None]
            print(f"{a.model} {a.cluster} {a.source} seed {seed} step {k} {names[ci]}"
                  f"{' (chosen)' if ci == sel.plan.strategy else ''}: plan / prototype "
                  + " ".join(f"{r} {'-' if rec[r]['ratio'] is None else format(rec[r]['ratio'], '.4f')}"
                             for r in a.rules.split(","))
                  + f"; best {max(rs) if rs else float('nan'):.4f}"
                  + f" (cpu {sum(rec[r]['cpu'] for r in a.rules.split(',')):.2f} s; plan {plan_cpu:.3f} s)", flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
