"""WLB-LLM variable-length packing with multi-level outlier-delay queues (WLB-LLM §4, Algorithm 1).

Per step, with N micro-batches of at most L_max tokens and workload W(l) = a l^2 + b l (W_a + W_l of WLB Eq. 2, the
per-document part of the cost model):

1. incoming = documents carried over from the last step (Remained_Doc) + newly sampled documents;
2. new documents of length >= L_1 are outliers: each goes to the FIFO queue i with L_i <= l < L_{i+1};
3. every queue holding >= N documents releases its N oldest (one outlier per micro-batch);
4. released + non-outlier documents are sorted by length, descending, and each goes to the micro-batch with the least
   workload if it fits in L_max, else to the one with the fewest tokens if it fits there, else it is carried over.

Extensions (documented in docs/wlb.md):
- `max_delay`: a document that has waited max_delay steps (in a queue or carried over) is *urgent*: it leaves its queue
  even if the queue is short, and urgent documents are placed before all others (largest first). If every step brings
  at most N * L_max / 2 new tokens, no document waits more than max_delay steps (proof in docs/wlb.md); otherwise
  documents may wait longer, but are still never dropped. max_delay=None keeps the paper's unbounded queues.
- fits means `<= L_max` (the paper writes `<`).
- `flush=True` (end of data) releases every queue; `wlb_flush` repeats flush steps until nothing is pending.

The state is a frozen dataclass: `wlb_step(state, ...) -> (WLBStep, new_state)` is pure.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tidal.core.errors import TidalError
from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.packing import PackResult, pipeline_time, validate


@dataclass(frozen=True)
class WLBConfig:
    n_micro: int  # N: micro-batches per step
    max_len: int  # L_max: tokens per micro-batch (memory limit, may exceed the context window)
    coeffs: LatencyCoeffs  # workload a l^2 + b l (+ c per non-empty micro-batch)
    thresholds: tuple[int, ...] = ()  # L_1 < ... < L_n; () disables outlier delay
    max_delay: int | None = 8  # steps after which a waiting document is urgent; None: unbounded (paper)

    def __post_init__(self) -> None:
        if self.n_micro < 1:
            raise TidalError(f"WLB: n_micro must be >= 1, got {self.n_micro}")
        if self.max_len < 1:
            raise TidalError(f"WLB: max_len must be >= 1, got {self.max_len}")
        t = tuple(self.thresholds)
        if any(x < 1 for x in t) or any(x >= y for x, y in zip(t, t[1:])):
            raise TidalError(f"WLB: outlier thresholds must be positive and strictly increasing, got {t}")
        if self.max_delay is not None and self.max_delay < 0:
            raise TidalError(f"WLB: max_delay must be >= 0 or None, got {self.max_delay}")


class Pending(NamedTuple):
    seq_id: int
    length: int
    arrival: int  # step at which the document was first offered


@dataclass(frozen=True)
class WLBState:
    step: int = 0  # index of the next step
    remained: tuple[Pending, ...] = ()  # did not fit last step (Remained_Doc)
    queues: tuple[tuple[Pending, ...], ...] = ()  # one FIFO per threshold

    @property
    def pending(self) -> tuple[Pending, ...]:
        return self.remained + tuple(p for q in self.queues for p in q)

    @property
    def empty(self) -> bool:
        return not self.remained and not any(self.queues)

    def to_dict(self) -> dict:
        enc = lambda ps: [[p.seq_id, p.length, p.arrival] for p in ps]  # noqa: E731
        return {"step": self.step, "remained": enc(self.remained), "queues": [enc(q) for q in self.queues]}

    @staticmethod
    def from_dict(d: dict) -> WLBState:
        try:
            dec = lambda ps: tuple(Pending(int(a), int(b), int(c)) for a, b, c in ps)  # noqa: E731
            return WLBState(int(d["step"]), dec(d["remained"]), tuple(dec(q) for q in d["queues"]))
        except (KeyError, TypeError, ValueError) as e:
            raise TidalError(f"malformed WLB state: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class WLBStep:
    step: int
    seq_ids: tuple[int, ...]  # incoming: carried over (did not fit, then still queued), then the new documents
    seq_lengths: tuple[int, ...]
    arrival: tuple[int, ...]  # step each incoming document first arrived
    micro_batches: tuple[tuple[int, ...], ...]  # indices into seq_ids; exactly n_micro (some may be empty)
    deferred: tuple[int, ...]  # indices into seq_ids carried to the next step (queued or did not fit)
    mb_times: tuple[float, ...] = field(default=())  # c + sum(a l^2 + b l) per micro-batch (0 if empty)

    @property
    def packed(self) -> tuple[int, ...]:
        return tuple(i for mb in self.micro_batches for i in mb)

    def delays(self) -> np.ndarray:
        """Steps waited by every packed document, in `packed` order."""
        return np.asarray([self.step - self.arrival[i] for i in self.packed], dtype=np.int64)

    def token_delay_sum(self) -> int:
        """sum over packed documents of length * delay (token-steps)."""
        return int(sum(self.seq_lengths[i] * (self.step - self.arrival[i]) for i in self.packed))

    @property
    def packed_tokens(self) -> int:
        return int(sum(self.seq_lengths[i] for i in self.packed))


def default_thresholds(context: int) -> tuple[int, ...]:
    """Two outlier queues at context/4 and context/2 (WLB Table 2: two queues reach 1.05; a third adds nothing)."""
    if context < 4:
        raise TidalError(f"WLB: context must be >= 4 tokens for default thresholds, got {context}")
    return (context // 4, context // 2)


def greedy_pack(lengths: np.ndarray, order: list[int], coeffs: LatencyCoeffs, n: int, max_len: int
                ) -> tuple[list[list[int]], list[int]]:
    """Lines 16-35 of Algorithm 1 over the documents `order` (indices into lengths), in that order, into n empty
    micro-batches. Returns (n micro-batches of indices, indices that fit nowhere). Heaps make it O(k log n)."""
    W = [0.0] * n
    T = [0] * n
    mbs: list[list[int]] = [[] for _ in range(n)]
    wheap = [(0.0, j) for j in range(n)]  # heaps already (sorted)
    lheap = [(0, j) for j in range(n)]
    a, b, d = coeffs.a, coeffs.b, coeffs.d
    left: list[int] = []
    for i in order:
        ln = int(lengths[i])
        while wheap[0][0] != W[wheap[0][1]]:
            heapq.heappop(wheap)
        j = wheap[0][1]
        if T[j] + ln > max_len:
            while lheap[0][0] != T[lheap[0][1]]:
                heapq.heappop(lheap)
            j = lheap[0][1]
            if T[j] + ln > max_len:
                left.append(i)
                continue
        mbs[j].append(i)
        W[j] += a * ln * ln + b * ln + d
        T[j] += ln
        heapq.heappush(wheap, (W[j], j))
        heapq.heappush(lheap, (T[j], j))
    return mbs, left


def wlb_step(state: WLBState, seq_ids, lengths, cfg: WLBConfig, *, flush: bool = False) -> tuple[WLBStep, WLBState]:
    """One step of Algorithm 1: returns what to run now and the state carrying every deferred document."""
    ids = [int(x) for x in np.asarray(seq_ids, dtype=np.int64).ravel()]
    lens = [int(x) for x in np.asarray(lengths, dtype=np.int64).ravel()]
    if len(ids) != len(lens):
        raise TidalError(f"WLB: {len(ids)} seq_ids but {len(lens)} lengths")
    bad = [x for x in lens if x < 1 or x > cfg.max_len]
    if bad:
        raise TidalError(f"WLB: document length {bad[0]} outside [1, max_len={cfg.max_len}]; split long documents")
    t, N = state.step, cfg.n_micro
    nq = len(cfg.thresholds)
    queues = [list(q) for q in state.queues] if state.queues else [[] for _ in range(nq)]
    if len(queues) != nq:
        raise TidalError(f"WLB: state has {len(queues)} queues but the config has {nq} thresholds")
    # incoming: Remained_Doc, then documents still queued from earlier steps, then the new ones
    n_old = len(state.remained)
    new = [Pending(i, ln, t) for i, ln in zip(ids, lens)]
    incoming = list(state.remained) + [p for q in queues for p in q] + new
    pos = {id(p): k for k, p in enumerate(incoming)}
    doc_set = list(incoming[:n_old])
    for p in new:
        k = bisect.bisect_right(cfg.thresholds, p.length) - 1  # the outlier queue L_k <= l < L_k+1; -1: none
        if k < 0:
            doc_set.append(p)
        else:
            queues[k].append(p)
    for k, q in enumerate(queues):
        if flush:
            doc_set += q
            queues[k] = []
            continue
        take = N if len(q) >= N else 0
        if cfg.max_delay is not None:
            while take < len(q) and t - q[take].arrival >= cfg.max_delay:
                take += 1
        doc_set += q[:take]
        queues[k] = q[take:]
    # urgent documents first, each part longest first
    doc_set.sort(key=lambda p: (not (cfg.max_delay is not None and t - p.arrival >= cfg.max_delay), -p.length,
                                p.arrival, p.seq_id))
    all_lens = np.asarray([p.length for p in incoming], dtype=np.int64)
    order = [pos[id(p)] for p in doc_set]
    mbs, left = greedy_pack(all_lens, order, cfg.coeffs, N, cfg.max_len)
    # reorder incoming so that carried-over (old) documents come first by arrival, then new ones
    remained = tuple(sorted((incoming[i] for i in left), key=lambda p: (p.arrival, p.seq_id)))
    new_state = WLBState(t + 1, remained, tuple(tuple(q) for q in queues))
    deferred = sorted(set(left) | {pos[id(p)] for q in queues for p in q})
    mb_t = tuple(cfg.coeffs.mb_time(all_lens[mb]) if mb else 0.0 for mb in mbs)
    res = WLBStep(
        step=t,
        seq_ids=tuple(p.seq_id for p in incoming),
        seq_lengths=tuple(p.length for p in incoming),
        arrival=tuple(p.arrival for p in incoming),
        micro_batches=tuple(tuple(mb) for mb in mbs),
        deferred=tuple(deferred),
        mb_times=mb_t,
    )
    return res, new_state


def wlb_flush(state: WLBState, cfg: WLBConfig) -> tuple[list[WLBStep], WLBState]:
    """End of data: flush steps (no new documents, every queue released) until nothing is pending."""
    out: list[WLBStep] = []
    while not state.empty:
        res, state = wlb_step(state, [], [], cfg, flush=True)
        if not res.packed:  # cannot happen: the largest pending document always fits an empty micro-batch
            raise TidalError("WLB flush made no progress")
        out.append(res)
    return out, state


def _best_count(lengths: np.ndarray, coeffs: LatencyCoeffs, pp: int, max_len: int) -> tuple[list[list[int]], float]:
    """Stateless in-pipeline WLB packing: try every micro-batch count V from ceil(total / max_len) upward and keep
    the V minimising (pp - 1 + V) * max micro-batch time (stop once the bound (pp - 1 + V) * max(c + W_max) is no
    better than the best found)."""
    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-int(lengths[i]), i))
    work = coeffs.doc_cost(lengths)
    total = int(lengths.sum())
    v0 = max(1, math.ceil(total / max_len))
    w_max = float(np.max(work)) + coeffs.c
    best: tuple[float, list[list[int]]] | None = None
    for v in range(v0, n + 1):
        if best is not None and (pp - 1 + v) * w_max >= best[0]:
            break
        mbs, left = greedy_pack(lengths, order, coeffs, v, max_len)
        if left:
            continue
        mbs = [mb for mb in mbs if mb]
        t = (pp - 1 + len(mbs)) * max(coeffs.mb_time(lengths[mb]) for mb in mbs)
        if best is None or t < best[0] - 1e-15:
            best = (t, mbs)
    # v0 <= n, and at v = n the greedy places every document (an empty micro-batch is left for each, lengths <=
    # max_len), so `best` is set
    assert best is not None
    return best[1], best[0]


def pack(lengths: np.ndarray, coeffs: LatencyCoeffs, pp: int, max_len: int, *, exact: bool = False) -> PackResult:
    """WLB variable-length packing of one pipeline's documents (no cross-step delay: every document is packed).
    `exact` is accepted for signature compatibility and ignored: WLB is a heuristic (docs/wlb.md)."""
    arr = validate(lengths, coeffs, pp, max_len)
    if arr.size == 0:
        return PackResult((), 0.0)
    return _result(arr, _best_count(arr, coeffs, pp, max_len)[0], coeffs, pp)


def _result(arr: np.ndarray, mbs: list[list[int]], coeffs: LatencyCoeffs, pp: int) -> PackResult:
    """The non-empty micro-batches, each ascending, in order of their first index, and their pipeline time."""
    out = tuple(sorted((tuple(sorted(mb)) for mb in mbs if mb), key=lambda mb: mb[0]))
    return PackResult(out, pipeline_time(arr, out, coeffs, pp))


def pack_fixed_count(lengths: np.ndarray, coeffs: LatencyCoeffs, pp: int, max_len: int, *,
                     exact: bool = False) -> PackResult:
    """WLB-LLM's packing as its paper ran it (§6.1: global batch = PP x DP micro-batches): one pipeline's documents
    into exactly `pp` micro-batches (Algorithm 1's greedy, least workload first, least length when over `max_len`);
    one more micro-batch only while some document fits nowhere. `exact` is ignored, as in `pack`."""
    arr = validate(lengths, coeffs, pp, max_len)
    if arr.size == 0:
        return PackResult((), 0.0)
    order = sorted(range(arr.size), key=lambda i: (-int(arr[i]), i))
    v = max(pp, math.ceil(int(arr.sum()) / max_len))
    while True:
        mbs, left = greedy_pack(arr, order, coeffs, v, max_len)
        if not left:
            break
        v += 1  # terminates: at v = len(arr) every document has a micro-batch of its own
    return _result(arr, mbs, coeffs, pp)
