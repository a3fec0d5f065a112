"""Property tests of the planner's padding-free CP sharding (pure numpy)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.core import TidalError
from tidal.core.cplayout import MODES
from tidal.planner.cp_sharding import rank_attention_pairs, shard_micro_batch

pytestmark = pytest.mark.unit

lengths_st = st.lists(st.integers(1, 70), min_size=1, max_size=12)
cp_st = st.sampled_from([1, 2, 3, 4, 8])
mode_st = st.sampled_from(MODES)


def rank_tokens(shard):
    """int64 [cp]: tokens each rank holds."""
    return np.array([rs.num_tokens for rs in shard.ranks], dtype=np.int64)


def _allowed_keys(shard, r):
    """Set of (query packed index, key packed index) pairs rank r's segments attend to."""
    rs = shard.ranks[r]
    out = set()
    cu = rs.cu_seqlens_q
    for s in range(len(rs.k_len)):
        q = rs.indices[cu[s] : cu[s + 1]]
        lq = len(q)
        for i, qi in enumerate(q):
            hi = rs.k_start[s] + rs.k_len[s] - lq + i + 1
            out |= {(int(qi), int(k)) for k in range(rs.k_start[s], hi)}
    return out


@settings(max_examples=150, deadline=None)
@given(lengths_st, cp_st, mode_st)
def test_partition_positions_pairs(lengths, cp, mode):
    shard = shard_micro_batch(lengths, cp, mode)
    total = sum(lengths)
    # every token on exactly one rank
    allidx = np.concatenate([rs.indices for rs in shard.ranks])
    assert sorted(allidx.tolist()) == list(range(total))
    # positions restart at every document
    pos = np.concatenate([np.arange(n) for n in lengths])
    doc = np.repeat(np.arange(len(lengths)), lengths)
    for rs in shard.ranks:
        assert np.array_equal(rs.positions, pos[rs.indices])
        assert np.array_equal(rs.doc_ids, doc[rs.indices])
        assert np.all(np.diff(rs.indices) > 0)
        assert rs.cu_seqlens_q[-1] == rs.num_tokens
    # attention pairs add up to the causal total
    pairs = rank_attention_pairs(shard)
    assert pairs.sum() == sum(n * (n + 1) // 2 for n in lengths)
    # balanced token counts, no padding
    toks = rank_tokens(shard)
    assert toks.sum() == total and toks.max() - toks.min() <= 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.sampled_from([2, 3, 4]), mode_st)
def test_key_ranges_are_exact_causal_document_masks(lengths, cp, mode):
    """Union over ranks of (query, key) pairs == {(q, k): same document, k <= q} in packed indices."""
    shard = shard_micro_batch(lengths, cp, mode)
    got = set().union(*(_allowed_keys(shard, r) for r in range(cp)))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    want = {(int(s + i), int(s + j)) for s, n in zip(starts, lengths) for i in range(n) for j in range(i + 1)}
    assert got == want


def test_per_doc_balances_long_documents():
    """Per-doc head-tail pairing equalises attention work where per-seq does not (WLB-LLM §5.1)."""
    lengths = [4096, 64, 64, 64]
    doc = rank_attention_pairs(shard_micro_batch(lengths, 4, "per-doc"))
    seq = rank_attention_pairs(shard_micro_batch(lengths, 4, "per-seq"))
    assert doc.max() / doc.mean() < 1.01
    assert seq.max() / seq.mean() > 1.05


def test_small_cases():
    s = shard_micro_batch([1] * 200, 4, "per-doc")
    assert rank_tokens(s).tolist() == [50, 50, 50, 50]
    s = shard_micro_batch([3], 4, "per-doc")  # shorter than 2*CP: one rank stays empty, nothing is padded
    assert rank_tokens(s).tolist() == [1, 1, 1, 0]
    assert s.ranks[3].cu_seqlens_q.tolist() == [0] and s.ranks[3].max_seqlen_q == 0
    s = shard_micro_batch([13], 2, "per-seq")
    assert rank_tokens(s).tolist() == [7, 6]
    assert s.ranks[0].indices.tolist() == [0, 1, 2, 3, 10, 11, 12]
    assert s.owner().tolist() == [0] * 4 + [1] * 6 + [0] * 3
    # per-doc by hand (C = 4 chunks paired 0-1-1-0, remainders round-robin with the counter carried over documents)
    assert shard_micro_batch([5, 3], 2, "per-doc").owner().tolist() == [0, 1, 1, 0, 0] + [1, 0, 1]
    assert shard_micro_batch([9, 2], 2, "per-doc").owner().tolist() == [0, 0, 1, 1, 1, 1, 0, 0, 0] + [1, 0]


@pytest.mark.parametrize("args", [([], 2, "per-doc"), ([3, 0], 2, "per-doc"), ([3], 0, "per-seq"),
                                  ([3], 2, "zigzag")])
def test_bad_input(args):
    with pytest.raises(TidalError):
        shard_micro_batch(*args)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40), cp=st.integers(1, 8),
       mode=st.sampled_from(["per-seq", "per-doc"]))
def test_segments_are_the_maximal_runs_of_each_ranks_tokens(lengths, cp, mode):
    """shard_micro_batch builds each rank's tokens from segment_pieces' segments; they must be exactly the maximal
    runs of the rank's tokens (from the tokens' owners) that stay in one document, in packed order, and give the same
    per-rank causal pairs."""
    from tidal.planner.cp_sharding import segment_pieces

    shard = shard_micro_batch(lengths, cp, mode)
    rank, q_start, q_len, doc = segment_pieces(lengths, cp, mode)
    owner = shard.owner()
    doc_of = np.repeat(np.arange(len(lengths)), lengths)
    pos_of = np.arange(owner.size) - np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    for r, rs in enumerate(shard.ranks):
        idx = np.flatnonzero(owner == r)
        np.testing.assert_array_equal(idx, rs.indices)
        # a new run starts where the packed index jumps or the document changes
        first = np.flatnonzero(np.concatenate([[idx.size > 0], (np.diff(idx) != 1) | (np.diff(doc_of[idx]) != 0)]))
        run_len = np.diff(np.append(first, idx.size))
        np.testing.assert_array_equal(q_start[rank == r], pos_of[idx[first]])
        np.testing.assert_array_equal(q_len[rank == r], run_len)
        np.testing.assert_array_equal(doc[rank == r], doc_of[idx[first]])
        np.testing.assert_array_equal(np.diff(rs.cu_seqlens_q.astype(np.int64)), run_len)
        np.testing.assert_array_equal(rs.positions, pos_of[idx])
    pairs = np.bincount(rank, weights=q_len * q_start + q_len * (q_len + 1) // 2, minlength=cp).astype(np.int64)
    np.testing.assert_array_equal(pairs, rank_attention_pairs(shard))
