"""Stage 2 of the two-stage assignment: pack one pipeline's sequences into V micro-batches (Hydraulis §6.1, Eq. 1).

Objective: min over V and the partition of (PP - 1 + V) * max_k (c + sum_{i in k} a l_i^2 + b l_i), every micro-batch
holding at most MaxLen tokens.

Heuristic (`pack`): for a handful of V around the minimiser of the convex per-V lower bound f(V)
(bounds.pipeline_bound),
inside the App. D range [ceil(tokens / MaxLen), tokens / UtilLen] widened to contain that minimiser, run capacity-aware
LPT (longest first into the least-loaded micro-batch that has room) and a vectorised move/swap local search on the
slowest micro-batch; then walk V up/down while it improves. V whose bound cannot beat the incumbent are skipped.
Exact (`pack(..., exact=True)`): the same, then a HiGHS MILP per V in bound order until the bound exceeds the incumbent.
`pack_fixed` is the token-count first-fit-decreasing baseline. Every packer has the `Packer` signature.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tidal.core.errors import TidalError
from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.bounds import PipeCost, check_lengths, check_pipe
from tidal.planner.pipecost import best_v


@dataclass(frozen=True)
class PackResult:
    micro_batches: tuple[tuple[int, ...], ...]  # indices into the packer's `lengths`
    est_time: float  # (PP - 1 + V) * max micro-batch time, seconds


class Packer(Protocol):
    def __call__(self, lengths: np.ndarray, coeffs: LatencyCoeffs, pp: int, max_len: int, *,
                 exact: bool = False) -> PackResult: ...


def pipeline_time(lengths, micro_batches, coeffs: LatencyCoeffs, pp: int) -> float:
    """(PP - 1 + V) * max micro-batch time of a packing (0 for no micro-batches)."""
    mbs = [mb for mb in micro_batches if len(mb)]
    if not mbs:
        return 0.0
    l_ = np.asarray(lengths, dtype=np.float64)
    worst = max(coeffs.mb_time(l_[list(mb)]) for mb in mbs)
    return (pp - 1 + len(mbs)) * worst


def _validate(lengths, coeffs: LatencyCoeffs, pp: int, max_len: int) -> np.ndarray:
    l_ = check_lengths(lengths)
    check_pipe(pp, max_len, coeffs)
    if l_.size and int(l_.max()) > max_len:
        raise TidalError(f"sequence of length {int(l_.max())} exceeds the pipeline's MaxLen {max_len}")
    return l_


def _finish(bin_of: np.ndarray, l_: np.ndarray, coeffs: LatencyCoeffs, pp: int,
            w: np.ndarray | None = None) -> PackResult:
    order = np.argsort(bin_of, kind="stable").tolist()  # ascending indices within each bin
    cnt = np.bincount(bin_of)
    ends = np.cumsum(cnt[cnt > 0]).tolist()
    # Deterministic order: micro-batches by first (smallest) index.
    mbs = tuple(sorted((tuple(order[a:b]) for a, b in zip([0] + ends[:-1], ends)), key=lambda g: g[0]))
    if w is None:
        return PackResult(mbs, pipeline_time(l_, mbs, coeffs, pp))
    # pipeline_time with the per-document work computed once: w holds the same element values mb_time computes
    # (a l^2 + b l + d in float64, same operation order), summed per micro-batch in the same order, so the same floats
    worst = max(float(coeffs.c + np.sum(w[list(mb)])) for mb in mbs)
    return PackResult(mbs, (pp - 1 + len(mbs)) * worst)


def _ffd(l_: np.ndarray, max_len: int, order: np.ndarray | None = None, compiled: bool = True) -> np.ndarray:
    """Token first-fit-decreasing: bin index per sequence (`order`: argsort(-l_, stable), when the caller has it).
    Compiled (kernels_pack.ffd, the same bins) when numba is there and `compiled`."""
    from tidal.planner import kernels_pack

    if order is None:
        order = np.argsort(-l_, kind="stable")
    if compiled and kernels_pack.AVAILABLE:
        return kernels_pack.ffd(l_, order, max_len)
    room: list[int] = []
    bin_of = np.empty(l_.size, dtype=np.int64)
    for i in order.tolist():
        x = int(l_[i])
        for k, r in enumerate(room):
            if r >= x:
                room[k] -= x
                bin_of[i] = k
                break
        else:
            room.append(max_len - x)
            bin_of[i] = len(room) - 1
    return bin_of


def pack_fixed(lengths, coeffs: LatencyCoeffs, pp: int, max_len: int, *, exact: bool = False) -> PackResult:
    """Baseline: token-count FFD into as few micro-batches of <= MaxLen tokens as it finds (ignores attention cost)."""
    l_ = _validate(lengths, coeffs, pp, max_len)
    if l_.size == 0:
        return PackResult((), 0.0)
    return _finish(_ffd(l_, max_len), l_, coeffs, pp)


def _lpt(l_: np.ndarray, w: np.ndarray, order: np.ndarray, V: int, M: int, c: float) -> np.ndarray | None:
    heap = [(c, k) for k in range(V)]
    tok = [0] * V
    bin_of = np.empty(l_.size, dtype=np.int64)
    for i in order.tolist():
        x = int(l_[i])
        held = []
        while heap:
            t, k = heapq.heappop(heap)
            if tok[k] + x <= M:
                break
            held.append((t, k))
        else:
            return None
        tok[k] += x
        bin_of[i] = k
        heapq.heappush(heap, (t + float(w[i]), k))
        for h in held:
            heapq.heappush(heap, h)
    return bin_of


def _refine(bin_of: np.ndarray, l_: np.ndarray, w: np.ndarray, V: int, M: int, c: float, rounds: int,
            max_docs: int = 32) -> None:
    """Move/swap sequences off the slowest micro-batch while that strictly lowers it (in place). All candidate moves
    of a round (one document per distinct length of the slowest micro-batch, longest first, to every micro-batch or
    for every other document) are evaluated in one vectorised pass; the first best in (document, move-then-swap,
    target) order is taken."""
    T = np.bincount(bin_of, weights=w, minlength=V) + c
    tok = np.bincount(bin_of, weights=l_, minlength=V).astype(np.int64)
    bins = np.arange(V)
    for _ in range(rounds):
        b = int(np.argmax(T))
        tb = T[b]
        is_b = bin_of == b
        mine = np.flatnonzero(is_b)
        others = np.flatnonzero(~is_b)
        _, first = np.unique(l_[mine], return_index=True)
        sel = mine[first][::-1][:max_docs]
        xs = l_[sel][:, None]
        wx = w[sel][:, None]
        n_u = sel.size
        mval = np.full(n_u, np.inf)
        mk = np.zeros(n_u, dtype=np.int64)
        if mine.size > 1:
            val = np.where((bins != b)[None, :] & (tok[None, :] + xs <= M), np.maximum(tb - wx, T[None, :] + wx),
                           np.inf)
            mk = np.argmin(val, axis=1)
            mval = val[np.arange(n_u), mk]
        sval = np.full(n_u, np.inf)
        sm = np.zeros(n_u, dtype=np.int64)
        if others.size:
            ke = bin_of[others]
            we = w[others][None, :]
            le = l_[others][None, :]
            ok = (tok[b] - xs + le <= M) & (tok[ke][None, :] - le + xs <= M) & (le != xs)
            val = np.where(ok, np.maximum(tb - wx + we, T[ke][None, :] - we + wx), np.inf)
            sm = np.argmin(val, axis=1)
            sval = val[np.arange(n_u), sm]
        both = np.stack([mval, sval], axis=1).ravel()  # doc 0 move, doc 0 swap, doc 1 move, ...
        m = int(np.argmin(both))
        if not both[m] < tb * (1 - 1e-12):
            return
        u, kind = divmod(m, 2)
        i = int(sel[u])
        if kind == 0:
            k, e = int(mk[u]), -1
        else:
            k, e = int(bin_of[others[sm[u]]]), int(others[sm[u]])
        for d, src, dst in ((i, b, k), (e, k, b)):
            if d < 0:
                continue
            T[src] -= w[d]
            T[dst] += w[d]
            tok[src] -= l_[d]
            tok[dst] += l_[d]
            bin_of[d] = dst


def _pack_v(l_, w, order, V, M, c, rounds, compiled: bool = True):
    """LPT into V micro-batches, then the move/swap rounds; compiled (kernels_pack.lpt and .refine, the same
    choices) when numba is there and `compiled`. None when LPT finds no room for a sequence."""
    from tidal.planner import kernels_pack

    if compiled and kernels_pack.AVAILABLE:
        bin_of, ok = kernels_pack.lpt(l_, w, order, V, M, c)
        if not ok:
            return None
        T = np.bincount(bin_of, weights=w, minlength=V) + c
        tok = np.bincount(bin_of, weights=l_, minlength=V).astype(np.int64)
        kernels_pack.refine(bin_of, l_, w, T, tok, V, M, rounds, 32)
        return bin_of
    bin_of = _lpt(l_, w, order, V, M, c)
    if bin_of is None:
        return None
    _refine(bin_of, l_, w, V, M, c, rounds)
    return bin_of


def _score(bin_of: np.ndarray, w: np.ndarray, c: float, pp: int) -> float:
    T = np.bincount(bin_of, weights=w)
    used = np.bincount(bin_of) > 0
    return float((pp - 1 + int(used.sum())) * (c + T[used].max()))


def pack(lengths, coeffs: LatencyCoeffs, pp: int, max_len: int, *, exact: bool = False,
         time_limit: float = 10.0, compiled: bool = True) -> PackResult:
    """Work-balanced packing of one pipeline's sequences (see module doc). Deterministic. The heuristic runs compiled
    (kernels_pack.pack_search, the same bins) when numba is there and `compiled`."""
    from tidal.planner import kernels_pack

    l_ = _validate(lengths, coeffs, pp, max_len)
    n = int(l_.size)
    if n == 0:
        return PackResult((), 0.0)
    p = PipeCost.of(coeffs, pp, max_len)
    w = p.work(l_)
    if n == 1:
        return _finish(np.zeros(1, dtype=np.int64), l_, coeffs, pp, w)
    c = p.c
    S, W, wmax = int(l_.sum()), float(w.sum()), float(w.max())
    vmin = max(1, -(-S // max_len))
    v_opt, _ = best_v(p.pp - 1, p.c, W, wmax, vmin, n)
    if v_opt == 1:  # one micro-batch meets the lower bound f(1) = PP (c + W): optimal
        return PackResult((tuple(range(n)),), pp * (c + W))
    order = np.argsort(-l_, kind="stable")
    v_util = min(n, max(vmin, int(S // coeffs.util_len())))
    v_hi = min(n, max(v_util, v_opt + 2))  # App. D upper end, widened to contain the bound's minimiser
    rounds = 20 + 2 * n

    def bound(V: int) -> float:
        return (pp - 1 + V) * max(W / V + c, c + wmax)

    if compiled and kernels_pack.AVAILABLE:
        best_bins, best = kernels_pack.pack_search(l_, w, order, max_len, c, pp, W, wmax, vmin, v_opt, v_hi, rounds)
    else:
        best_bins, best = _search(l_, w, order, max_len, c, pp, vmin, v_opt, v_hi, rounds, bound, compiled)
    if exact:
        from tidal.planner.exact import pack_milp_fixed_v

        for V in sorted(range(vmin, n + 1), key=lambda v: (bound(v), v)):
            if bound(V) >= best * (1 - 1e-9):
                break
            b = pack_milp_fixed_v(l_, w, V, max_len, c, time_limit=time_limit)
            if b is not None and _score(b, w, c, pp) < best:
                best_bins, best = b, _score(b, w, c, pp)
    # renumber bins densely (np.unique's inverse, without its sort), and check MaxLen here, where it is one bincount:
    # select._pack_groups trusts pack's micro-batches (each sequence exactly once by construction of _finish)
    used = np.bincount(best_bins) > 0
    dense = (np.cumsum(used) - 1)[best_bins]
    tokens = np.bincount(dense, weights=l_)
    if tokens.max() > max_len:  # token counts < 2^53: the float sums are exact
        raise TidalError(f"packing produced a micro-batch of {int(tokens.max())} tokens > MaxLen {max_len}")
    return _finish(dense.astype(np.int64), l_, coeffs, pp, w)


def _search(l_, w, order, max_len, c, pp, vmin, v_opt, v_hi, rounds, bound,
            compiled: bool) -> tuple[np.ndarray, float]:
    """pack's heuristic (the reference for kernels_pack.pack_search): FFD, then LPT + rounds for the candidate V by
    (bound, V), then a walk from the incumbent's V while it improves. Returns (bins, score)."""
    n = l_.size
    ffd = _ffd(l_, max_len, order, compiled)
    best_bins, best = ffd, _score(ffd, w, c, pp)
    tried: dict[int, float] = {}

    def attempt(V: int) -> float:
        nonlocal best_bins, best
        if V in tried or not vmin <= V <= n:
            return tried.get(V, math.inf)
        if bound(V) >= best * (1 - 1e-12):
            tried[V] = math.inf
            return math.inf
        b = _pack_v(l_, w, order, V, max_len, c, rounds, compiled)
        val = _score(b, w, c, pp) if b is not None else math.inf
        tried[V] = val
        if val < best:
            best_bins, best = b, val
        return val

    cands = sorted({vmin, v_opt - 1, v_opt, v_opt + 1, v_opt + 2, int(ffd.max()) + 1} & set(range(vmin, v_hi + 1)),
                   key=lambda v: (bound(v), v))
    for V in cands:
        attempt(V)
    # walk V from the incumbent while it improves
    v_best = int(np.bincount(best_bins).astype(bool).sum())
    for step in (1, -1):
        V = v_best + step
        while vmin <= V <= n and attempt(V) <= best:
            V += step
    return best_bins, best
