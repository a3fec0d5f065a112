"""WLB-LLM packing at 128K context: imbalance (max/mean micro-batch latency), token delay, planning time per step.

Set-up (WLB-LLM Table 1, 7B-128K): llama2-7b on h100x64 with <TP8, CP2, PP4, DP1>; global batch = PP x DP = 4
micro-batches of a 128K context window, i.e. 4 x 131072 tokens per step from the token-budget sampler (long documents
split at 128K). Latency of a micro-batch: c + sum(a l^2 + b l) from the analytic cost model of that scheme; the
variable-length limit L_max is the memory model's MaxLen of the scheme.

Methods (per step; whatever does not fit is carried to the next step, never dropped):
  original     Plain-4D: documents in sampled order, next-fit into 128K windows
  ffd          token-count first-fit-decreasing into 128K windows
  fixed        Fixed-4D greedy (one global batch): longest first into the window with the least attention work
               (sum l^2) that has room, windows capped at the 128K context
  wlb-q0       WLB var-len packing, no outlier queue
  wlb-q1..q3   WLB with 1..3 outlier queues, max_delay 8 steps

Usage: python benchmarks/wlb.py [--steps 300] [--data synthetic:github] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from tidal.baselines.wlb import WLBConfig, WLBState, wlb_step
from tidal.core import DEVICE_TYPES, get_cluster, get_model, parse_scheme
from tidal.costmodel import AnalyticCostModel
from tidal.costmodel.base import LatencyCoeffs
from tidal.data import sample_steps
from tidal.planner.metrics import mb_imbalance

CONTEXT = 131072
QUEUES = {"wlb-q0": (), "wlb-q1": (65536,), "wlb-q2": (32768, 65536), "wlb-q3": (16384, 32768, 65536)}


def fixed_step(carry, new, n, cap, mode: str):
    """Baseline packing of (id, len, arrival) docs into n windows of <= cap tokens; returns (mbs, left).
    mode: 'original' next-fit in order, 'ffd' token first-fit-decreasing, 'fixed' attention-greedy."""
    docs = carry + new
    greedy = mode == "fixed"
    if mode != "original":
        docs = sorted(docs, key=lambda d: -d[1])
    load = [0.0] * n
    tok = [0] * n
    mbs: list[list] = [[] for _ in range(n)]
    left = []
    j = 0
    for d in docs:
        if greedy:
            cand = [k for k in range(n) if tok[k] + d[1] <= cap]
            if not cand:
                left.append(d)
                continue
            k = min(cand, key=lambda k: (load[k], k))
        elif mode == "ffd":
            k = next((k for k in range(n) if tok[k] + d[1] <= cap), -1)
            if k < 0:
                left.append(d)
                continue
        else:
            while j < n and tok[j] + d[1] > cap:
                j += 1
            if j == n:
                left.append(d)
                continue
            k = j
        mbs[k].append(d)
        load[k] += d[1] * d[1]
        tok[k] += d[1]
    return mbs, left


def run(data: str, steps: int, seed: int) -> None:
    model, cluster = get_model("llama2-7b"), get_cluster("h100x64")
    scheme = parse_scheme("tp8pp4cp2")
    dev = DEVICE_TYPES["h100"]
    cm = AnalyticCostModel(model, cluster)
    co: LatencyCoeffs = cm.coeffs(scheme, dev)
    lmax = cm.max_len(scheme, dev)
    n = scheme.pp  # DP = 1
    batches, _ = sample_steps(data, seed=seed, tokens_per_step=n * CONTEXT, max_len=CONTEXT, steps=steps)
    toks = sum(b.tokens for b in batches)
    gc.collect()
    gc.freeze()  # the 300 pre-sampled steps are long-lived: keep CPython's full collections from timing them
    print(f"data={data} seed={seed} steps={steps} model=llama2-7b scheme=tp8pp4cp2 N={n} context={CONTEXT} "
          f"L_max={lmax} tokens/step<={n * CONTEXT} (mean {toks / steps:.0f}) a={co.a:.3e} b={co.b:.3e} c={co.c:.3e}")
    print(f"{'method':<10} {'imb mean':>8} {'p95':>6} {'max':>6} {'delay':>6} {'maxd':>5} {'ms mean':>8} {'ms p99':>7}"
          f" {'ms max':>7} {'sum step time':>13}")
    for name in ("original", "ffd", "fixed", *QUEUES):
        imb, ms, dsum, dmax, ttot, tstep = [], [], 0.0, 0, 0, 0.0
        if name in QUEUES:
            cfg = WLBConfig(n, lmax, co, QUEUES[name], max_delay=8)
            st = WLBState()
            for b in batches:
                t0 = time.perf_counter()
                r, st = wlb_step(st, b.seq_ids, b.lengths, cfg)
                ms.append((time.perf_counter() - t0) * 1e3)
                times = r.mb_times
                d = r.delays()
                dsum += r.token_delay_sum()
                ttot += r.packed_tokens
                dmax = max(dmax, int(d.max()) if d.size else 0)
                imb.append(mb_imbalance(times))
                tstep += (scheme.pp - 1 + n) * max(times)
        else:
            carry: list = []
            for s, b in enumerate(batches):
                new = [(i, ln, s) for i, ln in zip(b.seq_ids, b.lengths)]
                t0 = time.perf_counter()
                mbs, carry = fixed_step(carry, new, n, CONTEXT, name)
                ms.append((time.perf_counter() - t0) * 1e3)
                times = [co.mb_time([d[1] for d in mb]) if mb else 0.0 for mb in mbs]
                for mb in mbs:
                    for d in mb:
                        dsum += d[1] * (s - d[2])
                        ttot += d[1]
                        dmax = max(dmax, s - d[2])
                imb.append(mb_imbalance(times))
                tstep += (scheme.pp - 1 + n) * max(times)
        print(f"{name:<10} {np.mean(imb):8.3f} {np.percentile(imb, 95):6.3f} {np.max(imb):6.3f} {dsum / ttot:6.2f} "
              f"{dmax:5d} {np.mean(ms):8.3f} {np.percentile(ms, 99):7.2f} {np.max(ms):7.2f} {tstep:12.1f}s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--data", action="append")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for data in a.data or ["synthetic:github", "synthetic:commoncrawl"]:
        run(data, a.steps, a.seed)
        print()


if __name__ == "__main__":
    main()
