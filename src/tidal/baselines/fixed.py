"""Token-count first-fit-decreasing packing (baseline `fixed`): as few micro-batches of <= MaxLen tokens as FFD
finds, ignoring attention's quadratic cost. FFD is written once, in kernels_pack.py (packing.pack starts from it too).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.packing import PackResult, finish, validate


def pack_fixed(lengths, coeffs: LatencyCoeffs, pp: int, max_len: int, *, exact: bool = False,
               loops: SimpleNamespace | None = None) -> PackResult:
    """Token-count FFD (longest first, stable) into micro-batches of <= `max_len` tokens; `exact` is ignored. `loops`:
    kernels_pack.PLAIN or .COMPILED (None: compiled where numba is installed)."""
    l_ = validate(lengths, coeffs, pp, max_len)
    if l_.size == 0:
        return PackResult((), 0.0)
    if loops is None:
        from tidal.planner import kernels_pack

        loops = kernels_pack.loops()
    return finish(loops.ffd(l_, np.argsort(-l_, kind="stable"), max_len), l_, coeffs, pp)
