"""WLB-LLM's imbalance degree (its Table 2), measured on a length source as the simulator packs it.

WLB-LLM §6.3 defines the imbalance degree of one global batch as Max_Latency x PP / Total_Latency over the forward
latencies of its micro-batches (PP = 4 micro-batches per global batch, §6.1), and Table 2 reports it for its 7B-128K
job: Original Packing 1.44; Fixed-Len Greedy across 1 / 2 / 4 / 8 global batches 1.41 / 1.22 / 1.11 / 1.08.

Here a global batch is one step of the sampler (4 context windows of tokens, documents longer than the context split);
its micro-batch latency is the cost model's `mb_time` (c + sum a l^2 + b l; forward and backward scale alike, so the
ratio is the forward one's):
  original   the step as the static baselines pack it (FFD by length into context windows: `pack_fixed`), which is
             what `plain-4d` runs;
  greedy k   WLB-LLM's Fixed-Len Greedy (§3.2): the documents of k consecutive steps, longest first, each into the
             micro-batch of least attention work (sum l^2) that still has room (else the one with fewest tokens),
             k x PP micro-batches of at most one context window; the micro-batches are then grouped into k global
             batches by latency (the k x PP sorted, PP at a time), the grouping that the greedy's balance aims at.
  wlb-llm    WLB-LLM's own packing (Table 2's "#queue=2" row, 1.05) as `wlb-fixed` runs it in the simulator:
             Algorithm 1 with the two outlier queues at ctx/4 and ctx/2, PP micro-batches per step, L_max the
             smaller of 2 ctx and the scheme's memory MaxLen (`StepPlanner`'s). Never fitted: a held-out check.
Each figure is the mean over global batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.baselines import wlb
from tidal.baselines.fixed import pack_fixed
from tidal.core.errors import TidalError
from tidal.costmodel.base import LatencyCoeffs

UNIT = LatencyCoeffs(0.0, 1.0, 0.0)  # token-count packing ignores latency

# WLB-LLM Table 2 (7B-128K, PP = 4): imbalance degree of the original batches and of Fixed-Len Greedy over k batches
PAPER_TABLE2 = {"original": 1.44, "greedy 1": 1.41, "greedy 2": 1.22, "greedy 4": 1.11, "greedy 8": 1.08,
                "wlb-llm": 1.05}


def degree(times: Sequence[float] | np.ndarray) -> float:
    """Max x n / total of one global batch's micro-batch latencies."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0 or t.sum() <= 0:
        raise TidalError("imbalance degree of an empty global batch")
    return float(t.max() * t.size / t.sum())


def pp_speedup_bound(before: float, after: float, pp: int) -> float:
    """The most a PP-level repacking can speed a step up when it takes the imbalance degree from `before` to `after`,
    `pp` micro-batches on `pp` stages, each micro-batch the same time on every stage: the pipeline's makespan is then
    sum + (pp - 1) max (a flow shop; 1F1B's forward and backward alike) and max = degree x sum / pp, so the step time
    is sum x (1 + (pp - 1) / pp x degree) and the total work is unchanged by repacking. Per-step constants (optimizer,
    gradient sync) only lower it."""
    if pp < 1 or before < 1 or after < 1:
        raise TidalError(f"PP speed-up bound needs pp >= 1 and degrees >= 1, got {pp}, {before}, {after}")
    f = (pp - 1) / pp
    return (1 + f * before) / (1 + f * after)


def original(step: np.ndarray, coeffs: LatencyCoeffs, ctx: int) -> float:
    """Imbalance degree of one step packed by FFD into windows of `ctx` tokens (the static baselines' packing)."""
    arr = np.asarray(step, dtype=np.int64)
    bins = pack_fixed(arr, UNIT, 1, ctx).micro_batches
    return degree([coeffs.mb_time(arr[list(b)]) for b in bins])


def greedy_fixed_len(docs: np.ndarray, n: int, ctx: int, coeffs: LatencyCoeffs) -> list[np.ndarray]:
    """WLB-LLM's Fixed-Len Greedy: `n` micro-batches of <= ctx tokens, longest document first into the one of least
    attention work with room, else the one with fewest tokens (it may then exceed ctx: the greedy never drops)."""
    arr = np.sort(np.asarray(docs, dtype=np.int64))[::-1]
    work = np.zeros(n)
    toks = np.zeros(n, dtype=np.int64)
    mbs: list[list[int]] = [[] for _ in range(n)]
    for d in arr:
        room = toks + d <= ctx
        j = int(np.argmin(np.where(room, work, np.inf))) if room.any() else int(np.argmin(toks))
        work[j] += coeffs.a * float(d) * float(d)
        toks[j] += d
        mbs[j].append(int(d))
    return [np.asarray(m, dtype=np.int64) for m in mbs]


def greedy(steps: Sequence[np.ndarray], k: int, pp: int, coeffs: LatencyCoeffs, ctx: int) -> list[float]:
    """Imbalance degrees of the global batches that Fixed-Len Greedy forms across every k consecutive steps."""
    if k < 1 or pp < 1:
        raise TidalError(f"greedy imbalance needs k >= 1 and pp >= 1, got k={k}, pp={pp}")
    out: list[float] = []
    for g in range(0, len(steps) - k + 1, k):
        docs = np.concatenate([np.asarray(s, dtype=np.int64) for s in steps[g:g + k]])
        times = np.sort([coeffs.mb_time(m) for m in greedy_fixed_len(docs, k * pp, ctx, coeffs)])
        out += [degree(times[i:i + pp]) for i in range(0, k * pp, pp)]
    return out


def wlb_llm(steps: Sequence[np.ndarray], pp: int, coeffs: LatencyCoeffs, ctx: int, max_len: int | None = None
            ) -> list[float]:
    """Imbalance degrees of the global batches WLB-LLM's Algorithm 1 packs from these steps: two outlier queues at
    ctx/4 and ctx/2, `pp` micro-batches, L_max = min(2 ctx, max_len) as `StepPlanner` sets it for steps of pp context
    windows (`max_len`: the scheme's memory MaxLen, WLB-LLM §4.1; None: 2 ctx); steps whose micro-batches are all
    empty (everything queued) are skipped."""
    cfg = wlb.WLBConfig(pp, max(ctx, min(2 * ctx, max_len or 2 * ctx)), coeffs, wlb.default_thresholds(ctx))
    state, out, first = wlb.WLBState(), [], 0
    for s in steps:
        arr = np.asarray(s, dtype=np.int64)
        res, state = wlb.wlb_step(state, np.arange(first, first + arr.size), arr, cfg)
        first += arr.size
        lens = np.asarray(res.seq_lengths, dtype=np.int64)
        times = [coeffs.mb_time(lens[list(mb)]) if mb else 0.0 for mb in res.micro_batches]
        if sum(times) > 0:
            out.append(degree(times))
    return out


def table2(steps: Sequence[np.ndarray], coeffs: LatencyCoeffs, ctx: int, pp: int = 4, max_len: int | None = None
           ) -> dict[str, float]:
    """Table 2's rows on these steps: the mean imbalance degree of the original packing, of greedy 1/2/4/8 and of
    WLB-LLM's packing (L_max capped at `max_len`, the scheme's memory MaxLen)."""
    out = {"original": float(np.mean([original(s, coeffs, ctx) for s in steps]))}
    for k in (1, 2, 4, 8):
        out[f"greedy {k}"] = float(np.mean(greedy(steps, k, pp, coeffs, ctx)))
    out["wlb-llm"] = float(np.mean(wlb_llm(steps, pp, coeffs, ctx, max_len)))
    return out
