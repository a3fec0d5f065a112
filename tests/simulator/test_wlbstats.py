"""WLB-LLM's imbalance degree (its Table 2) and the synthetic:wlb-llm source built to reproduce it."""

import numpy as np
import pytest

from tidal.core import ParallelScheme, TidalError, get_cluster, get_model
from tidal.costmodel import AnalyticCostModel
from tidal.costmodel.base import LatencyCoeffs
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator import wlbstats

pytestmark = pytest.mark.unit

CTX = 131072


def test_degree_and_original_packing_by_hand():
    assert wlbstats.degree([3.0, 1.0, 1.0, 1.0]) == pytest.approx(2.0)  # 3 x 4 / 6
    assert wlbstats.degree([2.0, 2.0]) == pytest.approx(1.0)
    with pytest.raises(TidalError):
        wlbstats.degree([])
    k = LatencyCoeffs(1.0, 0.0, 0.0)  # attention only: a micro-batch costs sum l^2
    # FFD into windows of 8: [8], [4, 4], [4, 2, 2] -> 64, 32, 24: degree 64 x 3 / 120
    assert wlbstats.original(np.array([2, 4, 8, 4, 2, 4]), k, 8) == pytest.approx(64 * 3 / 120)


def test_pp_speedup_bound_is_the_flow_shop_makespan_ratio():
    # 4 micro-batches on 4 stages: times 4, 1, 1, 2 (degree 4 x 4 / 8 = 2) take 8 + 3 x 4 = 20; balanced 2, 2, 2, 2
    # (degree 1) take 8 + 3 x 2 = 14
    assert wlbstats.pp_speedup_bound(2.0, 1.0, 4) == pytest.approx(20 / 14)
    assert wlbstats.pp_speedup_bound(1.3, 1.3, 4) == pytest.approx(1.0)
    assert wlbstats.pp_speedup_bound(1.44, 1.05, 4) < 1.28  # WLB-LLM Table 2's degrees cannot give Fig. 13's 1.28
    with pytest.raises(TidalError):
        wlbstats.pp_speedup_bound(0.9, 1.0, 4)


def test_greedy_fixed_len_puts_the_longest_where_the_attention_is_least():
    k = LatencyCoeffs(1.0, 0.0, 0.0)
    mbs = wlbstats.greedy_fixed_len(np.array([6, 1, 5, 2, 2]), 2, 8, k)
    assert sorted(sorted(m.tolist()) for m in mbs) == [[1, 2, 5], [2, 6]]  # 6 | 5 | 2 -> 5's | 2 -> 6's | 1 -> 5's
    steps = [np.array([8]), np.array([2, 2, 2, 2]), np.array([8]), np.array([2, 2, 2, 2])]
    assert wlbstats.greedy(steps, 1, 1, k, 8) == [1.0] * 4  # one micro-batch per batch: balanced by definition
    # two steps pooled into 2 x 2 micro-batches of <= 8 tokens: 8 | 2 | 2 | 2, the last 2 onto a 2: work 64, 8, 4, 4;
    # sorted and grouped 2 at a time: (4, 4) balanced, (8, 64) at 64 x 2 / 72; twice (two pairs of steps)
    assert wlbstats.greedy(steps, 2, 2, k, 8) == pytest.approx([1.0, 128 / 72] * 2)
    with pytest.raises(TidalError):
        wlbstats.greedy(steps, 0, 4, k, 8)


def test_wlb_llm_delays_outliers_until_every_micro_batch_gets_one():
    k = LatencyCoeffs(1.0, 0.0, 0.0)  # attention only; ctx 16: outlier queues at 4 and 8
    # step 0: the 8 waits in its queue (1 < 2 micro-batches), the four 1s split 2 | 2; step 1: both 8s released,
    # one per micro-batch, then the 1s alternate: 66 | 66
    steps = [np.array([8, 1, 1, 1, 1]), np.array([1, 8, 1, 1, 1])]
    assert wlbstats.wlb_llm(steps, 2, k, 16) == pytest.approx([1.0, 1.0])
    # a lone outlier waits: only the 1 runs, on one of the 2 micro-batches (degree 1 x 2 / 1)
    assert wlbstats.wlb_llm([np.array([8, 1])], 2, k, 16) == pytest.approx([2.0])
    assert wlbstats.wlb_llm([np.array([8])], 2, k, 16) == []  # nothing runs: no global batch to measure
    # twelve 3s: L_max 2 ctx = 32 runs 6 | 6 at once; L_max = a memory MaxLen of 16 holds 5 | 5 and carries two 3s
    # into the next step (WLB-LLM §4.1), where they join its 1: 3 + 1 | 3, work 10 | 9
    two = [np.full(12, 3), np.array([1])]
    assert wlbstats.wlb_llm(two, 2, k, 16) == pytest.approx([1.0, 2.0])
    assert wlbstats.wlb_llm(two, 2, k, 16, max_len=16) == pytest.approx([1.0, 20 / 19])


def _table2(data: str, seed: int, steps: int) -> dict[str, float]:
    cm = AnalyticCostModel(get_model("llama2-7b"), get_cluster("h100x64"))
    sc, dev = ParallelScheme(8, 4, 2), cm.cluster.device_type(0)  # WLB-LLM Table 1's 7B-128K: TP8 PP4 CP2
    s = TokenBudgetSampler(length_source(data, seed), 4 * CTX, CTX, seed=seed)
    return wlbstats.table2([s.next_step().lengths_array() for _ in range(steps)], cm.coeffs(sc, dev), CTX,
                           max_len=cm.max_len(sc, dev))


def test_wlb_llm_source_reproduces_table2_on_a_held_out_seed():
    """The source's tail weight was set on seed 0 to Table 2's original 1.44; seed 1 is held out: the original
    within 5 %, Fixed-Len Greedy over 1 / 2 / 4 / 8 batches (1.41 / 1.22 / 1.11 / 1.08, never fitted) within 8 %,
    WLB-LLM's own packing (1.05 with two queues, never fitted) within 5 %."""
    got = _table2("synthetic:wlb-llm", 1, 96)
    assert got["original"] == pytest.approx(wlbstats.PAPER_TABLE2["original"], rel=0.05)
    for k in (1, 2, 4, 8):
        assert got[f"greedy {k}"] == pytest.approx(wlbstats.PAPER_TABLE2[f"greedy {k}"], rel=0.08), k
    g = [got[f"greedy {k}"] for k in (1, 2, 4, 8)]
    assert got["original"] > g[0] and all(x > y for x, y in zip(g, g[1:]))  # packing wider windows balances more
    assert got["wlb-llm"] == pytest.approx(wlbstats.PAPER_TABLE2["wlb-llm"], rel=0.05)
    assert got["wlb-llm"] < g[0]  # var-len packing with outlier delay balances within one global batch
    # Hydraulis' CommonCrawl is far more balanced at 128K: it could not stand in for WLB-LLM's corpus
    assert _table2("synthetic:commoncrawl", 1, 24)["original"] < 1.15
