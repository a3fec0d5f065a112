"""Context-parallel (CP) sharding of one packed micro-batch, padding-free; pure numpy. The layout types (`CPShard`,
`RankShard` with its fields, `MODES`) live in core/cplayout.py. docs/runtime.md, "CP sharding", states the two modes:
`per-seq` cuts the packed sequence into 2 cp chunks paired head-tail; `per-doc` pairs each document's body head-tail
and deals its remainder round-robin across documents. cp == 1 gives one segment per document.
"""

from __future__ import annotations

import numpy as np

from tidal.core.cplayout import MODES, CPShard, RankShard
from tidal.core.errors import TidalError


def _check(lengths, cp: int, mode: str) -> np.ndarray:
    if mode not in MODES:
        raise TidalError(f"unknown CP sharding mode {mode!r}; use one of {', '.join(MODES)}")
    if int(cp) != cp or cp < 1:
        raise TidalError(f"CP degree must be a positive integer, got {cp}")
    arr = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if arr.size == 0:
        raise TidalError("a micro-batch needs at least one document")
    if (arr < 1).any():
        raise TidalError(f"document lengths must be >= 1, got {int(arr.min())}")
    return arr


def _chunk_rank(cp: int) -> np.ndarray:
    """The rank of each of the 2 cp chunks: chunks r and 2 cp - 1 - r go to rank r (head-tail pairing)."""
    k = np.arange(2 * cp, dtype=np.int64)
    return np.minimum(k, 2 * cp - 1 - k)


def _chunk_sizes_per_seq(total: int, cp: int) -> np.ndarray:
    c = 2 * cp
    sizes = np.full(c, total // c, dtype=np.int64)
    extra = total % c
    heads = min(extra, cp)
    sizes[:heads] += 1  # head chunk of ranks 0..heads-1
    sizes[c - (extra - heads):] += 1  # then tail chunk of ranks 0.. (chunks c - 1, c - 2, ...)
    return sizes


def shard_micro_batch(lengths, cp: int, mode: str) -> CPShard:
    """Shard a packed micro-batch of documents `lengths` over `cp` ranks with `mode` ("per-seq" | "per-doc"): rank
    r's tokens are its segments of `segment_pieces`, in packed order."""
    arr = _check(lengths, cp, mode)
    starts = np.concatenate([[0], np.cumsum(arr)[:-1]]).astype(np.int64)
    rank, q_start, q_len, doc = segment_pieces(arr, cp, mode)
    ranks = []
    for r in range(cp):
        sel = rank == r
        qs, ql, d = q_start[sel], q_len[sel], doc[sel]
        cu = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
        pos = np.repeat(qs - cu[:-1], ql) + np.arange(int(cu[-1]), dtype=np.int64)  # position within its document
        docs = np.repeat(d, ql)
        k_len = qs + ql
        ranks.append(RankShard(indices=starts[docs] + pos, positions=pos, doc_ids=docs, cu_seqlens_q=cu,
                               k_start=starts[d], k_len=k_len, max_seqlen_q=int(ql.max(initial=0)),
                               max_seqlen_k=int(k_len.max(initial=0))))
    return CPShard(mode=mode, cp=int(cp), lengths=tuple(int(x) for x in arr), ranks=tuple(ranks))


def rank_attention_pairs(shard: CPShard) -> np.ndarray:
    """int64 [cp]: causal (query, key) pairs each rank's attention computes (a query at position p sees p+1 keys)."""
    return np.array([int((rs.positions + 1).sum()) for rs in shard.ranks], dtype=np.int64)


def segment_pieces(lengths, cp: int, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The query segments of `shard_micro_batch(lengths, cp, mode)`, which builds its token-level arrays from them.

    Returns int64 arrays (rank, q_start, q_len, doc), one entry per segment in packed order: a maximal run of one
    rank's tokens within one document `doc` (a test checks it against the tokens' owners), covering positions
    q_start .. q_start + q_len - 1 (so its k_len is q_start + q_len). O(documents + 2*cp), which is what the adaptive
    per-micro-batch choice needs to stay cheap."""
    arr = _check(lengths, cp, mode)
    c = 2 * cp
    chunk_rank = _chunk_rank(cp)
    doc_starts = np.concatenate([[0], np.cumsum(arr)[:-1]]).astype(np.int64)
    if mode == "per-seq":
        total = int(arr.sum())
        sizes = _chunk_sizes_per_seq(total, cp)
        chunk_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        keep = sizes > 0
        cuts = np.unique(np.concatenate([chunk_starts[keep], doc_starts]))
        run_len = np.diff(np.concatenate([cuts, [total]]))
        owner = chunk_rank[keep][np.searchsorted(chunk_starts[keep], cuts, side="right") - 1]
        doc = np.searchsorted(doc_starts, cuts, side="right") - 1
        pos = cuts - doc_starts[doc]
    else:
        q, rem = np.divmod(arr, c)
        has_body = np.flatnonzero(q > 0)
        b_doc = np.repeat(has_body, c)
        b_j = np.tile(np.arange(c), has_body.size)
        b_len = q[b_doc]
        b_pos = b_j * b_len
        b_owner = chunk_rank[b_j]
        rr = np.concatenate([[0], np.cumsum(rem)[:-1]]) % cp  # round-robin counter carried across documents
        r_doc = np.repeat(np.arange(arr.size), rem)
        r_t = np.arange(r_doc.size) - np.repeat(np.concatenate([[0], np.cumsum(rem)[:-1]]), rem)
        r_owner = (rr[r_doc] + r_t) % cp
        r_pos = c * q[r_doc] + r_t
        doc = np.concatenate([b_doc, r_doc])
        pos = np.concatenate([b_pos, r_pos])
        owner = np.concatenate([b_owner, r_owner])
        run_len = np.concatenate([b_len, np.ones(r_doc.size, dtype=np.int64)])
        order = np.lexsort((pos, doc))
        doc, pos, owner, run_len = doc[order], pos[order], owner[order], run_len[order]
    # merge consecutive runs of one document held by one rank (e.g. chunks cp-1 and cp, which are adjacent)
    new = np.ones(doc.size, dtype=bool)
    new[1:] = (doc[1:] != doc[:-1]) | (owner[1:] != owner[:-1])
    first = np.flatnonzero(new)
    seg_len = np.add.reduceat(run_len, first)
    # packed order within each rank == (document, position) order, which the runs already have
    return (owner[first].astype(np.int64), pos[first].astype(np.int64), seg_len.astype(np.int64),
            doc[first].astype(np.int64))

