"""Adaptive CP sharding on the kernel model, and per-document balance of attention FLOPs on packed micro-batches."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.baselines.wlb import WLBConfig, WLBState, wlb_step
from tidal.core import TidalError
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.kernel import KernelModel, causal_pairs
from tidal.data import sample_steps
from tidal.planner.cp_adaptive import choose_cp_sharding, choose_for_micro_batches
from tidal.planner.cp_sharding import rank_attention_pairs, shard_micro_batch
from tidal.planner.metrics import max_over_mean

pytestmark = pytest.mark.unit
K = KernelModel()


def shard_pieces(shard):
    """Per rank of a token-level shard: (q_start, q_len) of every query segment, positions within its document (the
    reference for choose_cp_sharding's segments, which come from cp_sharding.segment_pieces)."""
    out = []
    for rs in shard.ranks:
        q_len = np.diff(rs.cu_seqlens_q.astype(np.int64))
        out.append((rs.k_len - q_len, q_len))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=25), st.sampled_from([1, 2, 3, 4, 8]),
       st.sampled_from(["per-seq", "per-doc"]))
def test_pieces_cover_exactly_the_causal_pairs(lengths, cp, mode):
    shard = shard_micro_batch(lengths, cp, mode)
    pieces = shard_pieces(shard)
    got = [int(causal_pairs(qs, ql).sum()) for qs, ql in pieces]
    assert got == rank_attention_pairs(shard).tolist()
    assert sum(got) == sum(x * (x + 1) // 2 for x in lengths)
    for (qs, ql), rs in zip(pieces, shard.ranks):
        assert ql.sum() == rs.num_tokens and (qs >= 0).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30), st.sampled_from([2, 4]))
def test_choice_is_the_faster_mode(lengths, cp):
    c = choose_cp_sharding(lengths, cp, K)
    assert c.time_of(c.mode) == min(c.time_of("per-seq"), c.time_of("per-doc"))
    for mode in ("per-seq", "per-doc"):
        want = [K.rank_time(qs, ql) for qs, ql in shard_pieces(shard_micro_batch(lengths, cp, mode))]
        assert np.allclose(c.rank_times[mode], want)


def test_choice_follows_the_trade_off():
    # one document: both layouts are identical -> tie -> per-seq
    assert choose_cp_sharding([65536], 4, K).mode == "per-seq"
    # a long document next to short ones: per-seq chunks are badly unbalanced, per-doc wins
    assert choose_cp_sharding([60000, 3000, 2000, 1000], 4, K).mode == "per-doc"
    # many short documents: per-doc chunks are far below a tile, padding makes it slower
    c = choose_cp_sharding(np.full(400, 200), 4, K)
    assert c.mode == "per-seq" and c.time_of("per-doc") > 2 * c.time_of("per-seq")


def test_micro_batch_helper():
    lens = np.array([60000, 3000, 2000, 1000, 200, 200])
    mbs = ((0, 1, 2, 3), (4, 5))
    assert choose_for_micro_batches(lens, mbs, 1, K) == ()
    assert choose_for_micro_batches(lens, mbs, 4, K, "per-doc") == ("per-doc", "per-doc")
    assert choose_for_micro_batches(lens, mbs, 4, K)[0] == "per-doc"
    with pytest.raises(TidalError):
        choose_for_micro_batches(lens, mbs, 4, K, "zigzag")
    with pytest.raises(TidalError):
        choose_cp_sharding([], 4, K)


def test_per_doc_balances_attention_flops_at_cp4(record_property):
    """WLB §5.1 on packed micro-batches: per-document sharding max/mean attention FLOPs across CP=4 ranks <= 1.02."""
    context = 32768
    steps, _ = sample_steps("synthetic:github", seed=7, tokens_per_step=4 * context, max_len=context, steps=6)
    cfg = WLBConfig(4, 2 * context, LatencyCoeffs(1e-9, 1e-5, 1e-3), thresholds=(8192, 16384))
    state = WLBState()
    per_doc, per_seq = [], []
    for s in steps:
        res, state = wlb_step(state, s.seq_ids, s.lengths, cfg)
        for mb in res.micro_batches:
            if not mb:
                continue
            lens = [res.seq_lengths[i] for i in mb]
            per_doc.append(max_over_mean(rank_attention_pairs(shard_micro_batch(lens, 4, "per-doc"))))
            per_seq.append(max_over_mean(rank_attention_pairs(shard_micro_batch(lens, 4, "per-seq"))))
    assert len(per_doc) >= 20
    assert max(per_doc) <= 1.02
    record_property("per_doc_max_over_mean", max(per_doc))
    record_property("per_seq_max_over_mean_mean", float(np.mean(per_seq)))
    record_property("per_seq_max_over_mean_max", max(per_seq))
    print(f"CP=4 attention FLOPs max/mean over {len(per_doc)} packed micro-batches: per-doc max {max(per_doc):.4f}; "
          f"per-seq mean {np.mean(per_seq):.3f}, max {max(per_seq):.3f}")
