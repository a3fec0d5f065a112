"""Online refit of latency coefficients from measured training steps, robust to outliers.

A pipeline that runs V micro-batches in a step does, on its slowest rank, about the sum of their work:

    measured ~= sum_j T_j = a * sum_j sum_i l_ij^2 + b * sum_j sum_i l_ij + c * V + d * docs

so every (pipeline, step) pair is one linear observation `PipelineObs(scheme, sum_sq, sum_len, V, seconds, docs)` of
the scheme's (a, b, c, d). :func:`robust_fit` solves for them by iteratively reweighted non-negative least squares in
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

from tidal.core.errors import TidalError
from tidal.core.scheme import parse_scheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import CostModel, LatencyCoeffs
from tidal.costmodel.fitted import FittedCostModel, SchemeFit
from tidal.costmodel.robust import robust_fit


@dataclass(frozen=True)
class PipelineObs:
    """One pipeline of one measured step."""

    scheme: str  # str(ParallelScheme)
    sum_sq: float  # sum over its micro-batches of sum l^2
    sum_len: float  # sum over its micro-batches of sum l
    micro_batches: int
    seconds: float  # measured: the slowest rank's forward + backward CPU time
    docs: int = 0  # documents over its micro-batches (0 in rows written before the per-document term)

    def features(self) -> tuple[float, float, float, float]:
        return (self.sum_sq, self.sum_len, float(self.micro_batches), float(self.docs))


def refit_model(base: CostModel, observations: Sequence[PipelineObs], *, min_rows: int = 6) -> FittedCostModel:
    """A fitted model whose schemes with >= `min_rows` observations are refitted (prior: `base`'s coefficients);
    other schemes keep `base`'s fit when it is a FittedCostModel. MaxLen is always `base`'s."""
    if min_rows < 3:
        raise TidalError(f"refit needs min_rows >= 3, got {min_rows}")
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
        coef = robust_fit(X, t, (prior.a, prior.b, prior.c, prior.d))
        rel = (X @ coef - t) / t
        fits[key] = SchemeFit(LatencyCoeffs(*map(float, coef)), len(obs), float(np.sqrt(np.mean(rel ** 2))),
                              base.max_len(scheme, dev))
    if not fits:
        raise TidalError(f"refit: no scheme has {min_rows} observations yet")
    return with_fits(base, fits)


def with_fits(base: CostModel, fits: dict[str, SchemeFit]) -> FittedCostModel:
    """A fitted model of `base`'s model and cluster with these per-scheme fits; unfitted schemes fall back as in
    `base` (its analytic fallback, or `base` itself when analytic)."""
    fallback = base.fallback if isinstance(base, FittedCostModel) else AnalyticCostModel(base.model, base.cluster)
    return FittedCostModel(base.model, base.cluster, MappingProxyType(dict(fits)), fallback)
