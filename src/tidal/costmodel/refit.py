"""Online refit of latency coefficients from measured training steps, robust to outliers.

A pipeline that runs V micro-batches in a step does, on its slowest rank, about the sum of their work:

    measured ~= sum_j T_j = a * sum_j sum_i l_ij^2 + b * sum_j sum_i l_ij + c * V

so every (pipeline, step) pair is one linear observation `PipelineObs(scheme, sum_sq, sum_len, V, seconds)` of the
scheme's (a, b, c). :func:`robust_fit` solves for them by iteratively reweighted non-negative least squares in
relative error with Huber weights (residuals beyond 1.345 robust standard deviations are down-weighted, so a step
slowed by another process barely moves the fit), plus a weak ridge pull toward the prior coefficients, measured in
each term's share of an average row's time (so a prior that is far off, e.g. the nominal analytic model, does not
bias what the rows determine): a direction the observations cannot identify (training micro-batches of one scheme
often have similar token counts, so sum_len and V are nearly collinear) stays near the prior instead of wandering.
Everything is deterministic in its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from scipy.optimize import nnls

from tidal.core.errors import TidalError
from tidal.core.scheme import parse_scheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import CostModel, LatencyCoeffs
from tidal.costmodel.fitted import FittedCostModel, SchemeFit

HUBER_K = 1.345  # 95 % efficiency under Gaussian noise
PRIOR_WEIGHT = 1e-2  # a move that shifts the average prediction by 10 % costs as much as one row 1 % off
MIN_SCALE = 0.005  # robust residual scale floor (relative): below this every row counts fully


@dataclass(frozen=True)
class PipelineObs:
    """One pipeline of one measured step."""

    scheme: str  # str(ParallelScheme)
    sum_sq: float  # sum over its micro-batches of sum l^2
    sum_len: float  # sum over its micro-batches of sum l
    micro_batches: int
    seconds: float  # measured: the slowest rank's forward + backward CPU time

    def features(self) -> tuple[float, float, float]:
        return (self.sum_sq, self.sum_len, float(self.micro_batches))


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


def refit_model(base: CostModel, observations: Sequence[PipelineObs], *, min_rows: int = 6) -> FittedCostModel:
    """A fitted model whose schemes with >= `min_rows` observations are refitted (prior: `base`'s coefficients);
    other schemes keep `base`'s fit when it is a FittedCostModel. MaxLen is always `base`'s."""
    if min_rows < 3:
        raise TidalError(f"refit needs min_rows >= 3 (three coefficients), got {min_rows}")
    dev = base.cluster.device_type(0)
    by: dict[str, list[PipelineObs]] = {}
    for o in observations:
        by.setdefault(o.scheme, []).append(o)
    fits: dict[str, SchemeFit] = dict(base.fits) if isinstance(base, FittedCostModel) else {}
    for key in sorted(by):
        obs = by[key]
        if len(obs) < min_rows:
            continue
        scheme = parse_scheme(key)
        prior = base.coeffs(scheme, dev)
        X = np.array([o.features() for o in obs])
        t = np.array([o.seconds for o in obs])
        coef = robust_fit(X, t, (prior.a, prior.b, prior.c))
        rel = (X @ coef - t) / t
        fits[key] = SchemeFit(LatencyCoeffs(*map(float, coef)), len(obs), float(np.sqrt(np.mean(rel ** 2))),
                              base.max_len(scheme, dev))
    if not fits:
        raise TidalError(f"refit: no scheme has {min_rows} observations yet")
    fallback = base.fallback if isinstance(base, FittedCostModel) else AnalyticCostModel(base.model, base.cluster)
    return FittedCostModel(base.model, base.cluster, MappingProxyType(fits), fallback)
