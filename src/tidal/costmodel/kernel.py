"""CP-level attention kernel model (WLB-LLM §5.2-5.3): tile padding and achieved FLOP/s by query length.

A *piece* is one contiguous run of query tokens of one causal document on one CP rank: query positions
[q_start, q_start + q_len) of the document (0-based), attending to keys [0, q_start + q_len) after the K/V all-gather.

Exact work: pairs(piece) = sum_{i=q_start}^{q_start+q_len-1} (i + 1)   (causal query-key pairs).

Kernel work (what a FlashAttention-style varlen kernel computes): queries are cut into tiles of `tile` rows aligned to
the piece start, keys into tiles aligned to the document start; a (query tile, key tile) block is computed in full if
any of its pairs is unmasked, and skipped otherwise. A query tile covering rows up to position p computes
ceil((p + 1) / tile) key tiles of tile x tile pairs, so short pieces are padded to a whole tile (WLB §5.2 (1)).

Achieved FLOP/s rises with the (tile-padded) query length q_p and saturates (WLB Fig. 10 right: flat up to 128
because of padding, a large jump from 128 to 256 from TMA multicast of shared K/V tiles, then saturation):

    achieved(q) = peak * q_p^h / (q_p^h + q_half^h),     q_p = tile * ceil(q / tile)

The defaults (peak 989 TFLOP/s * 0.6, q_half 174, h 2) put achieved(128) at 0.35 peak, achieved(256) at 0.68 peak and
achieved(1024) at 0.97 peak: a shape read off WLB Fig. 10, not a measurement. `fit_achieved` fits
(peak, q_half, h) to profiled (q_len, FLOP/s) points with scipy.

Piece time = padded pairs * flops_per_pair / achieved(q_len); a rank's attention time is the sum over its pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec


def causal_pairs(q_start, q_len) -> np.ndarray:
    """Exact causal query-key pairs of pieces (vectorised): sum of (i + 1) for i in [q_start, q_start + q_len)."""
    s = np.asarray(q_start, dtype=np.float64)
    n = np.asarray(q_len, dtype=np.float64)
    e = s + n
    return (e * (e + 1) - s * (s + 1)) / 2


def padded_pairs(q_start, q_len, tile: int) -> np.ndarray:
    """Query-key pairs a tiled causal kernel computes for pieces (vectorised over pieces)."""
    s = np.atleast_1d(np.asarray(q_start, dtype=np.int64))
    n = np.atleast_1d(np.asarray(q_len, dtype=np.int64))
    out = np.zeros(s.shape, dtype=np.float64)
    nt = -(-n // tile)  # query tiles per piece
    # query tile j of a piece ends at position min(s + (j+1) tile, s + n) - 1; it computes ceil(end / tile) key tiles
    # (end = exclusive end). Sum over j in closed form per piece would need floor sums; tile counts are small enough
    # per piece (<= max_len / tile) to expand with repeat.
    pid = np.repeat(np.arange(s.size), nt)
    if pid.size:
        first = np.repeat(np.cumsum(nt) - nt, nt)
        j = np.arange(pid.size) - first
        end = np.minimum(s[pid] + (j + 1) * tile, s[pid] + n[pid])
        ktiles = -(-end // tile)
        np.add.at(out, pid, ktiles.astype(np.float64))
    return out * tile * tile


@dataclass(frozen=True)
class KernelModel:
    """Attention kernel latency for per-rank pieces. flops_per_pair: forward(+backward) FLOPs per query-key pair
    of the whole layer stack on one rank (e.g. 3 * 4 * head_dim * heads / tp * layers for fwd+bwd)."""

    tile: int = 128
    peak: float = 989e12 * 0.6  # saturated achieved FLOP/s of the attention kernel
    q_half: float = 174.0  # padded query length at which achieved = peak / 2
    hill: float = 2.0
    flops_per_pair: float = 4.0 * 4096  # default: one llama2-7b layer forward, TP=1

    def __post_init__(self) -> None:
        if self.tile < 1 or self.peak <= 0 or self.q_half <= 0 or self.hill <= 0 or self.flops_per_pair <= 0:
            raise TidalError(f"kernel model parameters must be positive: {self}")

    def achieved(self, q_len) -> np.ndarray:
        """Achieved FLOP/s of a piece with q_len query tokens (vectorised)."""
        q = np.asarray(q_len, dtype=np.float64)
        qp = self.tile * np.ceil(np.maximum(q, 1) / self.tile)
        r = (qp / self.q_half) ** self.hill
        return self.peak * r / (1.0 + r)

    def piece_times(self, q_start, q_len) -> np.ndarray:
        """Seconds per piece."""
        return padded_pairs(q_start, q_len, self.tile) * self.flops_per_pair / self.achieved(q_len)

    def rank_time(self, q_start, q_len) -> float:
        """Attention seconds of one rank holding the given pieces."""
        if np.size(q_len) == 0:
            return 0.0
        return float(np.sum(self.piece_times(q_start, q_len)))

    def rank_flops(self, q_start, q_len, padded: bool = False) -> float:
        """Exact (or tile-padded) attention FLOPs of one rank."""
        if np.size(q_len) == 0:
            return 0.0
        pairs = padded_pairs(q_start, q_len, self.tile) if padded else causal_pairs(q_start, q_len)
        return float(np.sum(pairs) * self.flops_per_pair)


def kernel_for(model: ModelSpec, *, tp: int = 1, layers: int = 1, peak: float = 989e12 * 0.6, passes: float = 1.0,
               tile: int = 128, q_half: float = 174.0) -> KernelModel:
    """Kernel model of `layers` attention layers of `model` under TP degree `tp`: flops_per_pair =
    passes * 4 * hidden / tp * layers (passes = 1 forward only, ~3 forward + backward)."""
    if tp < 1 or layers < 1 or passes <= 0:
        raise TidalError(f"kernel_for: tp, layers and passes must be positive, got tp={tp} layers={layers}")
    fpp = passes * model.attn_flops_per_token_pair() / tp * layers
    return KernelModel(tile=tile, peak=peak, q_half=q_half, flops_per_pair=fpp)


def fit_achieved(q_lens, flops_per_s, base: KernelModel | None = None) -> KernelModel:
    """Fit (peak, q_half, hill) of the saturating curve to profiled points (least squares on relative error)."""
    from scipy.optimize import least_squares

    base = base or KernelModel()
    q = np.asarray(q_lens, dtype=np.float64)
    y = np.asarray(flops_per_s, dtype=np.float64)
    if q.ndim != 1 or q.shape != y.shape or q.size < 3 or np.any(q < 1) or np.any(y <= 0):
        raise TidalError("fit_achieved: need >= 3 points of positive query lengths and FLOP/s of equal shape")
    qp = base.tile * np.ceil(q / base.tile)

    def resid(x):
        peak, qh, h = np.exp(x)
        r = (qp / qh) ** h
        return (peak * r / (1 + r)) / y - 1.0

    x0 = np.log([y.max(), float(np.median(qp)), 2.0])
    sol = least_squares(resid, x0)
    peak, qh, h = np.exp(sol.x)
    return replace(base, peak=float(peak), q_half=float(qh), hill=float(h))
