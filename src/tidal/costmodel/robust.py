"""Robust least squares for latency coefficients: Huber-IRLS non-negative least squares in relative error.

Used by the profile fit (`fitted.fit_rows`, no prior) and the online refit (`refit.refit_model`, with the starting
model as a weak ridge prior). Deterministic in its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from tidal.core.errors import TidalError

HUBER_K = 1.345  # 95 % efficiency under Gaussian noise
PRIOR_WEIGHT = 1e-2  # a move that shifts the average prediction by 10 % costs as much as one row 1 % off
MIN_SCALE = 0.005  # robust residual scale floor (relative): below this every row counts fully


def robust_fit(X: np.ndarray, t: np.ndarray, prior: Sequence[float] | None = None, *, iters: int = 30,
               prior_weight: float = PRIOR_WEIGHT) -> np.ndarray:
    """Huber-IRLS NNLS of X @ coef ~= t in relative error ((X coef - t) / t), optionally pulled toward `prior`
    (a ridge on each coefficient, scaled by its feature's mean relative size). Returns coef >= 0."""
    X = np.asarray(X, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if X.ndim != 2 or len(X) != len(t) or len(t) == 0:
        raise TidalError(f"robust_fit: need a non-empty (n, k) matrix and n targets, got {X.shape} and {t.shape}")
    if not np.all(np.isfinite(X)) or not np.all(np.isfinite(t)) or np.any(t <= 0) or np.any(X < 0):
        raise TidalError("robust_fit: features must be finite and >= 0, targets finite and > 0")
    k = X.shape[1]
    scale = np.where(X.max(axis=0) > 0, X.max(axis=0), 1.0)
    A = X / scale / t[:, None]  # relative residual rows: A @ (coef * scale) - 1
    extra_A, extra_b = [], []
    if prior is not None:  # ridge in units of the coefficient's share of an average row's time
        for j, p in enumerate(prior):
            row = np.zeros(k)
            row[j] = np.sqrt(prior_weight) * float(A[:, j].mean())
            extra_A.append(row)
            extra_b.append(row[j] * p * scale[j])
    w = np.ones(len(t))
    sol = np.zeros(k)
    for _ in range(iters):
        sw = np.sqrt(w)
        M = np.vstack([A * sw[:, None], *extra_A]) if extra_A else A * sw[:, None]
        rhs = np.concatenate([sw, extra_b]) if extra_b else sw
        new, _ = nnls(M, rhs)
        r = A @ new - 1.0
        s = max(MIN_SCALE, 1.4826 * float(np.median(np.abs(r - np.median(r)))))
        delta = HUBER_K * s
        w = np.where(np.abs(r) <= delta, 1.0, delta / np.maximum(np.abs(r), 1e-300))
        if np.allclose(new, sol, rtol=1e-10, atol=0.0):
            sol = new
            break
        sol = new
    return sol / scale
