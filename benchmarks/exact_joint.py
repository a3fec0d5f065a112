"""Exact joint dispatch + packing of one step on one candidate, by MILP (HiGHS), against the planner (issue 9).

The planner's two stages (dispatch, then packing) and its polish are heuristics; its step bound is a relaxation. On
a small step this script asks HiGHS for the joint optimum of one candidate whose pipelines all have PP = 1: each
document goes to one micro-batch of one pipeline, micro-batch tokens <= MaxLen, and a pipeline with V micro-batches
takes V x its slowest one (c + sum of w). Printed: the candidate's refined and mode-aware bounds, the planner's plan
without and with polish, and the MILP's best plan and dual bound when the time limit ends.

The MILP only considers up to --max-mbs micro-batches per pipeline, so its plans are valid but its dual bound holds
for that restriction only (not a bound on the planner's problem).

    python benchmarks/exact_joint.py --model llama2-7b --cluster a800x16 --strategy "tp4+4*tp2+4*tp1" \\
        --data synthetic:github --seed 0 --step 0 --time-limit 120
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from tidal.core import get_cluster, get_model, parse_strategy, place
from tidal.core.errors import TidalError
from tidal.costmodel import default_cost_model
from tidal.data import sample_steps
from tidal.planner import select as sel
from tidal.planner.bounds import StrategyBound
from tidal.planner.config import PlannerConfig
from tidal.proof.modes import mode_bound


def solve(l_: np.ndarray, pipes, max_mbs: int, lo: float, hi: float, time_limit: float):
    """min T over x[i, j, m] (document i in micro-batch m of pipeline j), y[j, v] (pipeline j runs v micro-batches)."""
    n, D = l_.size, len(pipes)
    K = [max(1, min(max_mbs, n)) for _ in pipes]
    xs = [(i, j, m) for j in range(D) for m in range(K[j]) for i in range(n) if l_[i] <= pipes[j].max_len]
    xi = {key: t for t, key in enumerate(xs)}
    ys = [(j, v) for j in range(D) for v in range(1, K[j] + 1)]
    yi = {key: len(xs) + t for t, key in enumerate(ys)}
    T = len(xs) + len(ys)
    w = [[p.a * x * x + p.b * x + p.d for x in l_.astype(float)] for p in pipes]
    big = 4.0 * hi * max_mbs
    rows, cols, vals, lo_b, hi_b = [], [], [], [], []

    def add(coefs, a, b):
        r = len(lo_b)
        for c, v in coefs:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo_b.append(a)
        hi_b.append(b)

    for i in range(n):  # each document exactly once
        add([(xi[(i, j, m)], 1.0) for j in range(D) for m in range(K[j]) if (i, j, m) in xi], 1, 1)
    for j, p in enumerate(pipes):
        add([(yi[(j, v)], 1.0) for v in range(1, K[j] + 1)], 1, 1)  # one micro-batch count
        for m in range(K[j]):
            here = [i for i in range(n) if (i, j, m) in xi]
            add([(xi[(i, j, m)], float(l_[i])) for i in here], -np.inf, p.max_len)  # tokens
            add([(xi[(i, j, m)], 1.0) for i in here] + [(yi[(j, v)], -float(n)) for v in range(m + 1, K[j] + 1)],
                -np.inf, 0)  # micro-batch m is empty unless v > m
            for v in range(m + 1, K[j] + 1):  # T >= v (c + load_m) when pipeline j runs v micro-batches
                add([(T, 1.0)] + [(xi[(i, j, m)], -v * w[j][i]) for i in here] + [(yi[(j, v)], -big)],
                    v * p.c - big, np.inf)
            if m + 1 < K[j]:  # symmetry: micro-batch tokens non-increasing
                nxt = [i for i in range(n) if (i, j, m + 1) in xi]
                add([(xi[(i, j, m)], float(l_[i])) for i in here] + [(xi[(i, j, m + 1)], -float(l_[i])) for i in nxt],
                    0, np.inf)
    nv = T + 1
    A = coo_matrix((vals, (rows, cols)), shape=(len(lo_b), nv)).tocsr()
    c = np.zeros(nv)
    c[T] = 1.0
    integ = np.ones(nv)
    integ[T] = 0
    bounds = Bounds(np.r_[np.zeros(nv - 1), lo], np.r_[np.ones(nv - 1), hi])
    t0 = time.perf_counter()
    res = milp(c, constraints=LinearConstraint(A, lo_b, hi_b), integrality=integ, bounds=bounds,
               options=dict(time_limit=time_limit, disp=False, mip_rel_gap=1e-4))
    return res, nv, len(lo_b), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--cluster", default="a800x16")
    ap.add_argument("--strategy", default="tp4+4*tp2+4*tp1")
    ap.add_argument("--data", default="synthetic:github")
    ap.add_argument("--tokens-per-step", type=int, default=200_000)
    ap.add_argument("--max-len", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--max-mbs", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    model, cluster = get_model(args.model), get_cluster(args.cluster)
    prof = sel.profile_strategies([place(parse_strategy(args.strategy), cluster, model)],
                                  default_cost_model(model, cluster))[0]
    if any(p.pp != 1 for p in prof.pipes):
        raise SystemExit("exact_joint.py: only strategies whose pipelines all have PP = 1")
    steps = sample_steps(args.data, seed=args.seed, tokens_per_step=args.tokens_per_step, max_len=args.max_len,
                         steps=args.step + 1)[0]
    l_ = steps[args.step].lengths_array()
    sb = StrategyBound(l_, prof.pipes)
    rb = sb.refined()
    mb = mode_bound(sb, rb, 10 * rb)
    plain = sel.assign(l_, prof, target=rb, config=PlannerConfig(polish_rounds=0))[0]
    polished = sel.assign(l_, prof, target=rb)[0]
    print(f"# {args.model} {args.cluster} {args.strategy} {args.data} seed {args.seed} step {args.step}: "
          f"{l_.size} documents, {len(prof.pipes)} pipelines")
    print(f"bound: refined {rb:.4f} s, mode-aware {mb:.4f} s")
    print(f"planner: {plain:.4f} s without polish ({plain / rb:.4f} x bound), {polished:.4f} s with it "
          f"({polished / rb:.4f} x)")
    res, nv, nr, dt = solve(l_, prof.pipes, args.max_mbs, max(rb, mb), max(plain, polished), args.time_limit)
    best = getattr(res, "fun", None)
    print(f"MILP ({nv} variables, {nr} rows, <= {args.max_mbs} micro-batches per pipeline): {res.message.strip()} "
          f"after {dt:.1f} s")
    print(f"  best plan {best if best is None else f'{best:.4f} s'}, dual bound "
          f"{getattr(res, 'mip_dual_bound', float('nan')):.4f} s (for that restriction)")


if __name__ == "__main__":
    try:
        main()
    except TidalError as e:  # a bad model, cluster, strategy or data spec: one line
        raise SystemExit(f"exact_joint.py: {e}") from None
