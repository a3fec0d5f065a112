"""Fitted latency model: least-squares coefficients from measured (scheme, documents, seconds) rows.

Profile file (CSV, written by `tidal profile`, documented in docs/costmodel.md):

    # tidal-profile/1 model=<preset> device=<device type>
    scheme,lengths,seconds
    tp1pp1cp1,4096 512 512,0.731

`seconds` is the forward+backward time of one micro-batch on the slowest stage of the scheme; `lengths` are the packed
documents, space-separated. For each scheme we solve min ||X [a b c d]^T - t|| with X = [sum l^2, sum l, 1, count]
under a, b, c, d >= 0, in relative error (so short micro-batches count as much as long ones), Huber-robust
(`costmodel.robust.robust_fit`: a micro-batch slowed by another process is down-weighted, not fitted).
When every row of a scheme holds the same number of documents, d cannot be told from c and is 0.

Fitted model file (JSON; `tidal profile --out` writes it):
    {"format": "tidal-costmodel/1", "model": ..., "device": ...,
     "schemes": {"tp1pp1cp1": {"a": ..., "b": ..., "c": ..., "d": ..., "rows": 12, "rel_rmse": 0.03,
                               "max_len": 20480}}}

Schemes that were not profiled fall back to the analytic model with each coefficient scaled by the median
fitted/analytic ratio of that coefficient over the profiled schemes, and d (which the analytic model does not have) the
profiled schemes' median d x PP divided by the scheme's PP (per-document work is per layer; documented fallback,
reported by `describe()`). `d` is optional in the file (0 when absent: files written before it existed).
`max_len` is optional per scheme (measured by `tidal profile`); without it MaxLen is the analytic memory model's.
Other top-level keys (`memory`, `profile`, ...) are kept for people and ignored here.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from tidal.core.cluster import ClusterSpec, DeviceType
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme, parse_scheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.memory import MemoryConfig
from tidal.costmodel.robust import robust_fit

PROFILE_FORMAT = "tidal-profile/1"
MODEL_FORMAT = "tidal-costmodel/1"


@dataclass(frozen=True)
class ProfileRow:
    scheme: ParallelScheme
    lengths: tuple[int, ...]
    seconds: float


@dataclass(frozen=True)
class SchemeFit:
    coeffs: LatencyCoeffs
    rows: int
    rel_rmse: float
    max_len: int | None = None  # measured MaxLen (tidal profile); None: the analytic memory model's


def read_profile(path: str | Path) -> list[ProfileRow]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TidalError(f"cannot read profile {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TidalError(f"profile {path} is not a UTF-8 text file") from None
    return parse_profile(text, str(path))


def parse_profile(text: str, name: str = "<profile>") -> list[ProfileRow]:
    lines = [ln for ln in text.splitlines() if not ln.startswith("#") and ln.strip()]
    reader = csv.reader(io.StringIO("\n".join(lines)))
    header = next(reader, None)
    if header is None or [h.strip() for h in header] != ["scheme", "lengths", "seconds"]:
        raise TidalError(f"{name}: profile header must be 'scheme,lengths,seconds', got {header}")
    rows = []
    for n, rec in enumerate(reader, start=2):
        if len(rec) != 3:
            raise TidalError(f"{name}: row {n}: expected 3 fields, got {len(rec)}")
        try:
            scheme = parse_scheme(rec[0])
            lengths = tuple(int(x) for x in rec[1].split())
            seconds = float(rec[2])
        except (ValueError, TidalError) as e:
            raise TidalError(f"{name}: row {n}: {e}") from None
        if not lengths or min(lengths) < 1 or not np.isfinite(seconds) or seconds <= 0:
            raise TidalError(f"{name}: row {n}: need positive lengths and seconds")
        rows.append(ProfileRow(scheme, lengths, seconds))
    if not rows:
        raise TidalError(f"{name}: profile has no rows")
    return rows


def fit_rows(rows: list[ProfileRow]) -> dict[str, SchemeFit]:
    """Per scheme robust NNLS fit of [sum l^2, sum l, 1, count] -> seconds, in relative error (count dropped, d = 0,
    when every row of the scheme holds the same number of documents). rel_rmse is over all rows, outliers included."""
    by_scheme: dict[str, list[ProfileRow]] = {}
    for r in rows:
        by_scheme.setdefault(str(r.scheme), []).append(r)
    out = {}
    for key in sorted(by_scheme):
        rs = by_scheme[key]
        if len(rs) < 3:
            raise TidalError(f"scheme {key}: need >= 3 profile rows to fit a, b, c; got {len(rs)}")
        X = np.array([[sum(x * x for x in r.lengths), sum(r.lengths), 1.0, len(r.lengths)] for r in rs],
                     dtype=np.float64)
        if np.all(X[:, 3] == X[0, 3]):
            X[:, 3] = 0.0
        t = np.array([r.seconds for r in rs])
        coef = robust_fit(X, t)
        pred = X @ coef
        rel = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
        out[key] = SchemeFit(LatencyCoeffs(*map(float, coef)), len(rs), rel)
    return out


@dataclass(frozen=True)
class FittedCostModel:
    model: ModelSpec
    cluster: ClusterSpec
    fits: MappingProxyType  # str(scheme) -> SchemeFit
    fallback: AnalyticCostModel
    reference_len: int = 4096
    scale: float = field(init=False)  # median fitted / analytic time at reference_len (reported)
    term_scale: tuple[float, float, float] = field(init=False)  # median fitted / analytic ratio of a, b and c
    d_times_pp: float = field(init=False)  # median fitted d x PP (the fallback's d is this / PP)

    def __reduce__(self):  # the read-only mapping does not pickle; travel as a dict (to a background planner)
        return (_rebuild_fitted, (self.model, self.cluster, dict(self.fits), self.fallback, self.reference_len))

    def __post_init__(self) -> None:
        if not self.fits:
            raise TidalError("fitted cost model has no schemes")
        dev = self.cluster.device_type(0)
        ratios, terms, dpp = [], [], []
        for key, fit in self.fits.items():
            s = parse_scheme(key)
            ana = self.fallback.coeffs(s, dev)
            ratios.append(fit.coeffs.mb_time([self.reference_len]) / ana.mb_time([self.reference_len]))
            terms.append([f / a if a > 0 else 1.0 for f, a in zip((fit.coeffs.a, fit.coeffs.b, fit.coeffs.c),
                                                                   (ana.a, ana.b, ana.c))])
            dpp.append(fit.coeffs.d * s.pp)
        object.__setattr__(self, "scale", float(np.median(ratios)))
        object.__setattr__(self, "term_scale", tuple(float(x) for x in np.median(np.asarray(terms), axis=0)))
        object.__setattr__(self, "d_times_pp", float(np.median(dpp)))

    def coeffs(self, scheme: ParallelScheme, device: DeviceType) -> LatencyCoeffs:
        """A profiled scheme's fit; otherwise the analytic coefficients with each term (a: attention, b: per token,
        c: per micro-batch) scaled by the profiled schemes' median fitted/analytic ratio of that term, so an
        unprofiled scheme keeps the measured balance between quadratic and linear work; d (per document, absent from
        the analytic model) is the profiled schemes' median d x PP over the scheme's PP."""
        fit = self.fits.get(str(scheme))
        if fit is not None:
            return fit.coeffs
        k = self.fallback.coeffs(scheme, device)
        sa, sb, sc = self.term_scale
        return LatencyCoeffs(k.a * sa, k.b * sb, k.c * sc, self.d_times_pp / scheme.pp)

    def fit_for(self, key: str, devices) -> SchemeFit | None:
        """The measured fit of scheme `key` (str(scheme)) for a pipeline on `devices` (device types), or None. A
        profile describes the machine it ran on; a subclass that knows its device type refuses others."""
        return self.fits.get(key)

    def max_len(self, scheme: ParallelScheme, device: DeviceType) -> int:
        """The profiled MaxLen of a scheme where the file has one, else the analytic memory model's."""
        fit = self.fits.get(str(scheme))
        if fit is not None and fit.max_len is not None:
            return fit.max_len
        return self.fallback.max_len(scheme, device)

    def describe(self) -> str:
        sa, sb, sc = self.term_scale
        return (f"fitted on {len(self.fits)} scheme(s) ({', '.join(self.fits)}); others: analytic with a x {sa:.3g}, "
                f"b x {sb:.3g}, c x {sc:.3g}, d = {self.d_times_pp:.3g} / PP")

    def to_json(self, device_name: str, extra: dict | None = None) -> str:
        """The fitted model file; `extra` adds informational top-level keys (ignored by the loader)."""
        schemes = fits_to_json(self.fits)
        head = {"format": MODEL_FORMAT, "model": self.model.name, "device": device_name}
        return json.dumps({**head, **(extra or {}), "schemes": schemes}, indent=1)


def fitted_from_rows(rows: list[ProfileRow], model: ModelSpec, cluster: ClusterSpec, *,
                     memory: MemoryConfig | None = None) -> FittedCostModel:
    """`memory`: the analytic fallback's memory model (MaxLen of unprofiled schemes; default `MemoryConfig()`)."""
    fallback = AnalyticCostModel(model, cluster) if memory is None else AnalyticCostModel(model, cluster, memory=memory)
    return FittedCostModel(model, cluster, MappingProxyType(fit_rows(rows)), fallback)


def fits_to_json(fits) -> dict:
    """The "schemes" object of a model file: per scheme a, b, c, d, rows, rel_rmse and max_len (if profiled)."""
    out = {}
    for k, f in fits.items():
        d = {"a": f.coeffs.a, "b": f.coeffs.b, "c": f.coeffs.c, "d": f.coeffs.d, "rows": f.rows,
             "rel_rmse": f.rel_rmse}
        if f.max_len is not None:
            d["max_len"] = f.max_len
        out[k] = d
    return out


def fits_from_json(schemes, what: str) -> dict[str, SchemeFit]:
    """Inverse of fits_to_json, validated; `what` names the source in the one-line error."""
    try:
        fits = {str(parse_scheme(k)): SchemeFit(LatencyCoeffs(float(v["a"]), float(v["b"]), float(v["c"]),
                                                              float(v.get("d", 0.0))),
                                                int(v.get("rows", 0)), float(v.get("rel_rmse", 0.0)),
                                                None if v.get("max_len") is None else int(v["max_len"]))
                for k, v in schemes.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TidalError(f"malformed {what}: {type(e).__name__}: {e}") from None
    for k, f in fits.items():
        co = (f.coeffs.a, f.coeffs.b, f.coeffs.c, f.coeffs.d)
        if not all(np.isfinite(co)) or min(co) < 0 or (f.max_len is not None and f.max_len < 0):
            raise TidalError(f"malformed {what}: scheme {k} needs finite a, b, c, d >= 0 and max_len >= 0")
    return fits


def _rebuild_fitted(model: ModelSpec, cluster: ClusterSpec, fits: dict, fallback: AnalyticCostModel,
                    reference_len: int) -> FittedCostModel:
    return FittedCostModel(model, cluster, MappingProxyType(fits), fallback, reference_len)
