"""Stage 2 of the two-stage assignment: pack one pipeline's sequences into V micro-batches (Hydraulis §6.1, Eq. 1).

Objective: min over V and the partition of (PP - 1 + V) * the slowest micro-batch (PP = 1: their sum, decision 94),
every micro-batch holding at most MaxLen tokens. `pack` runs capacity-aware LPT and a local search for a few V around
the bound's minimiser (the loops written once in kernels_pack.py, compiled where numba is installed), and with
`exact=True` a MILP per V (exact.py). The baselines' packers share `validate`, `finish` and the `Packer` signature.
docs/planner.md, "Packing", states the search.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Protocol

import numpy as np

from tidal.core.errors import TidalError
from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.bounds import PipeCost, check_lengths, check_pipe, prices_eq1
from tidal.planner.pipecost import packed_value, pipe_value, stage_q


@dataclass(frozen=True)
class PackResult:
    micro_batches: tuple[tuple[int, ...], ...]  # indices into the packer's `lengths`
    est_time: float  # (PP - 1 + V) * max micro-batch time (PP = 1: their sum), seconds


class Packer(Protocol):
    def __call__(self, lengths: np.ndarray, coeffs: LatencyCoeffs, pp: int, max_len: int, *,
                 exact: bool = False) -> PackResult: ...


def pipeline_time(lengths, micro_batches, coeffs: LatencyCoeffs, pp: int) -> float:
    """(PP - 1 + V) * max micro-batch time of a packing; the sum of the micro-batch times when PP = 1 (decision 94),
    or V * the slowest one when `coeffs` carry Hydraulis Eq. 1 (bounds.Eq1Coeffs, decision 97); 0 for no
    micro-batches."""
    mbs = [mb for mb in micro_batches if len(mb)]
    if not mbs:
        return 0.0
    from tidal.planner import kernels_sums

    sizes = [len(mb) for mb in mbs]
    flat = np.fromiter(itertools.chain.from_iterable(mbs), dtype=np.int64, count=sum(sizes))
    # the per-micro-batch work as coeffs.mb_time sums it (c + this is mb_time), and as `finish` sums it
    # (kernels_pack.layout): np.sum of
    # a x^2 + b x + d over the micro-batch's lengths in its order, the same floats (kernels_sums.np_sum)
    works = kernels_sums.loops().mb_works(np.ascontiguousarray(lengths, dtype=np.float64), flat,
                                          np.array(sizes, dtype=np.int64), float(coeffs.a), float(coeffs.b),
                                          float(coeffs.d))
    works = works.tolist()
    c = float(coeffs.c)
    return packed_value(stage_q(pp, prices_eq1(coeffs)), c, float(sum(works)), max(c + x for x in works), len(works))


def validate(lengths, coeffs: LatencyCoeffs, pp: int, max_len: int) -> np.ndarray:
    """A packer's checks of its input: the lengths as an int64 array, each <= MaxLen, and the pipeline's cost."""
    l_ = check_lengths(lengths)
    check_pipe(pp, max_len, coeffs)
    if l_.size and int(l_.max()) > max_len:
        raise TidalError(f"sequence of length {int(l_.max())} exceeds the pipeline's MaxLen {max_len}")
    return l_


def finish(bin_of: np.ndarray, l_: np.ndarray, coeffs: LatencyCoeffs, pp: int, ids: np.ndarray | None = None,
           loops: SimpleNamespace | None = None) -> PackResult:
    """The packing whose sequence i is in bin bin_of[i], laid out and timed (kernels_pack.layout: micro-batches by
    first index, ascending indices within; pipeline_time's float: no micro-batch and 0.0 for no sequence); `ids` and
    `loops` as in `pack`."""
    if not bin_of.size:
        return PackResult((), 0.0)
    if loops is None:
        from tidal.planner import kernels_pack

        loops = kernels_pack.loops()
    p = PipeCost.of(coeffs, pp, 1)  # its work and q (MaxLen plays no part)
    return _result(*loops.layout(bin_of, l_, p.work(l_), p.c, p.q)[:3], ids)


def _result(ol: np.ndarray, ends: np.ndarray, est: float, ids: np.ndarray | None) -> PackResult:
    """A PackResult from kernels_pack.layout's indices grouped by micro-batch and their ends, named by `ids`."""
    ol, ends = (ol if ids is None else ids[ol]).tolist(), ends.tolist()
    return PackResult(tuple(tuple(ol[a:b]) for a, b in zip([0] + ends[:-1], ends)), float(est))


def pack(lengths, coeffs: LatencyCoeffs, pp: int, max_len: int, *, exact: bool = False,
         loops: SimpleNamespace | None = None, ids: np.ndarray | None = None) -> PackResult:
    """Work-balanced packing of one pipeline's sequences (see module doc). Deterministic. `loops`: the heuristic's
    loops (kernels_pack.PLAIN or .COMPILED, the same source); None takes kernels_pack.loops(), compiled where numba
    is installed. `ids`: an int64 array naming the sequences in the result (ids[i] for sequence i; default i), e.g.
    their indices in the step (passes.pack_groups)."""
    if loops is None:
        from tidal.planner import kernels_pack

        loops = kernels_pack.loops()
    l_ = validate(lengths, coeffs, pp, max_len)
    if l_.size == 0:
        return PackResult((), 0.0)
    p, S = PipeCost.of(coeffs, pp, max_len), int(l_.sum())
    args = (l_, p.a, p.b, p.d, p.c, p.q, max_len, S, int(S // coeffs.util_len()))
    if not exact:  # the whole heuristic in one compiled call
        ol, ends, est, tmax = loops.pack_core(*args)
    else:  # the heuristic's packing, then a MILP per V whose bound f(V) can beat it, by (f(V), V)
        from tidal.planner.exact import pack_milp_fixed_v

        bins, best, w, W, wmax, vmin = loops.pack_bins(*args)
        for V in sorted(range(vmin, l_.size + 1), key=lambda v: (pipe_value(p.q, p.c, W, wmax, v), v)):
            if pipe_value(p.q, p.c, W, wmax, V) >= best * (1 - 1e-9):
                break
            b = pack_milp_fixed_v(l_, w, V, max_len, p.c)
            if b is not None and loops.pack_score(b, w, p.c, p.q) < best:
                bins, best = b, loops.pack_score(b, w, p.c, p.q)
        ol, ends, est, tmax = loops.layout(bins, l_, w, p.c, p.q)
    # MaxLen is checked here, once per packing: passes.pack_groups trusts pack's micro-batches (each sequence exactly
    # once by construction of the layout)
    if tmax > max_len:
        raise TidalError(f"packing produced a micro-batch of {int(tmax)} tokens > MaxLen {max_len}")
    return _result(ol, ends, est, ids)
