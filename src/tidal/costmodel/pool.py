"""Profile-pool cost model: Hydraulis' published strategy pools (`strategy_pool_*.json`) read as they are.

A pool (the JSON Hydraulis' `strategy/generate_strategy_*.py` writes; /work/shared/data/hydraulis-profiles/README.md)
holds, per <TP, PP> scheme (CP = 1), `a, b, c` such that one micro-batch of packed documents l_i costs
`a * sum l_i^2 + b * sum l_i + c` **milliseconds** on one pipeline stage, forward and backward; and a memory
regression. `PoolCostModel` is a `FittedCostModel` whose fits are the pool's schemes (seconds: the pool's figures
/ 1e3, exactly), so the planner, `tidal simulate` (its `fit_scale`) and the online refit treat it as a profile.

Schemes the pool does not hold (CP > 1, other TP/PP, uneven layer splits, the one-stage schemes the simulator asks for
per-layer slopes) are **anchored**: the profiled scheme nearest to it (same TP first, then the nearest PP in log2,
then the nearest TP in log2) times the fallback analytic model's ratio target / anchor, term by term (a, b, c):

    k(target) = pool(anchor) * analytic(target) / analytic(anchor)

so what the pool measures (efficiency at this TP, constants) is kept and what it cannot measure (CP's ring, the
other PP split) comes from the analytic model. A term that is 0 in the analytic anchor is taken from the analytic
target unscaled.

Devices: a pool describes one device type, read from `gpu_memory_bound` (>= 50 GB: "a800"; else "a100-40", the
7b_A100 pool). On devices of another type the model is the fallback analytic model. The pool's model is `H, L`;
the ModelSpec must have the same hidden size and layer count (vocabularies may differ: the pool's is padded).

MaxLen (memory_regression, Hydraulis' own linear model, per device of the first stage, which holds PP micro-batches'
activations under 1F1B):
    activations = A[tp] * H / (tp * cp) * (L / pp) * pp * tokens         bytes
    states      = (L / pp) * (H^2 / tp) * B * ((1 - alpha) + alpha / DP),  DP = N / (tp pp cp)
    budget      = gpu_memory_bound - gap[group] - safe_bound             group: gpu1 | gpu2 | gpu4 | node by tp*cp
    MaxLen      = floor((budget - states) / (activations per token)), 0 when the states do not fit
`A[tp]` for a TP the pool does not list is the largest listed TP's (the measured A grows with TP).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from tidal.core.cluster import ClusterSpec, DeviceType
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.fitted import FittedCostModel, SchemeFit

POOL_DEVICE_SPLIT = 50e9  # gpu_memory_bound above this: an 80 GB A800 pool; below: the 40 GB A100 pool


@dataclass(frozen=True)
class PoolScheme:
    tp: int
    pp: int
    a: float  # ms / token^2
    b: float  # ms / token
    c: float  # ms

    def coeffs(self) -> LatencyCoeffs:
        """Seconds (the pool's milliseconds / 1e3)."""
        return LatencyCoeffs(self.a / 1e3, self.b / 1e3, self.c / 1e3)

    def ms(self, s: float) -> float:
        """The pool's own a s^2 + b s + c, in ms, for one sequence of s tokens."""
        return self.a * s * s + self.b * s + self.c


@dataclass(frozen=True)
class HydraulisPool:
    name: str
    schemes: tuple[PoolScheme, ...]
    hidden: int
    layers: int
    vocab: int
    act_bytes: MappingProxyType  # tp -> A[tp]
    state_bytes: float  # B
    alpha: float
    gap: MappingProxyType  # "gpu1" | "gpu2" | "gpu4" | "node" -> bytes
    safe_bound: float
    memory_bound: float
    gpus_per_node: int
    utilization_seqlen: MappingProxyType  # tp -> tokens
    hetero_dp_ms: float

    @property
    def device(self) -> str:
        return "a800" if self.memory_bound >= POOL_DEVICE_SPLIT else "a100-40"

    def get(self, tp: int, pp: int) -> PoolScheme | None:
        for s in self.schemes:
            if s.tp == tp and s.pp == pp:
                return s
        return None

    def act_bytes_of(self, tp: int) -> float:
        if tp in self.act_bytes:
            return float(self.act_bytes[tp])
        below = [t for t in self.act_bytes if t <= tp]
        return float(self.act_bytes[max(below) if below else min(self.act_bytes)])

    def gap_of(self, group: int) -> float:
        key = "gpu1" if group <= 1 else "gpu2" if group <= 2 else "gpu4" if group <= 4 else "node"
        return float(self.gap.get(key, max(self.gap.values())))


def is_pool(d) -> bool:
    """True for a parsed JSON object that looks like a Hydraulis strategy pool."""
    return isinstance(d, dict) and "strategies" in d and "model_config" in d


def _tp_map(d: dict, what: str) -> MappingProxyType:
    out = {}
    for k, v in d.items():
        if not (isinstance(k, str) and k.startswith("tp") and k[2:].isdigit()):
            raise TidalError(f"malformed {what}: key {k!r} is not tpN")
        out[int(k[2:])] = float(v)
    return MappingProxyType(out)


def parse_pool(d: dict, name: str = "<pool>") -> HydraulisPool:
    """Validate and parse a pool object (one-line TidalError on anything malformed)."""
    try:
        schemes = tuple(PoolScheme(int(s["tp"]), int(s["pp"]), float(s["a"]), float(s["b"]), float(s["c"]))
                        for s in d["strategies"])
        mem, mc, cc = d["memory_regression"], d["model_config"], d["cluster_config"]
        pool = HydraulisPool(
            name=name, schemes=schemes, hidden=int(mc["H"]), layers=int(mc["L"]), vocab=int(mc.get("V", 0)),
            act_bytes=_tp_map(mem["A"], f"pool {name} memory_regression.A"), state_bytes=float(mem["B"]),
            alpha=float(mem["alpha"]), gap=MappingProxyType({str(k): float(v) for k, v in mem["gap"].items()}),
            safe_bound=float(mem["safe_bound"]), memory_bound=float(cc["gpu_memory_bound"]),
            gpus_per_node=int(cc.get("gpus_per_node", 8)),
            utilization_seqlen=_tp_map(cc.get("utilization_seqlen", {}), f"pool {name} utilization_seqlen"),
            hetero_dp_ms=float(d.get("comm_cost", {}).get("hetero_dp", 0.0)))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TidalError(f"malformed strategy pool {name}: {type(e).__name__}: {e}") from None
    if not schemes:
        raise TidalError(f"malformed strategy pool {name}: no strategies")
    seen = set()
    for s in schemes:
        if s.tp < 1 or s.pp < 1 or not all(math.isfinite(x) and x >= 0 for x in (s.a, s.b, s.c)) or s.b <= 0:
            raise TidalError(f"malformed strategy pool {name}: tp{s.tp}pp{s.pp} needs tp, pp >= 1, a, c >= 0, b > 0")
        if (s.tp, s.pp) in seen:
            raise TidalError(f"malformed strategy pool {name}: tp{s.tp}pp{s.pp} listed twice")
        seen.add((s.tp, s.pp))
    if not pool.act_bytes or not pool.gap or pool.hidden < 1 or pool.layers < 1:
        raise TidalError(f"malformed strategy pool {name}: needs memory_regression.A, gap and model_config H, L")
    return pool


def read_pool(path: str | Path) -> HydraulisPool:
    try:
        d = json.loads(Path(path).read_text())
    except OSError as e:
        raise TidalError(f"cannot read strategy pool {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise TidalError(f"malformed strategy pool {path}: {e}") from None
    if not is_pool(d):
        raise TidalError(f"{path}: not a Hydraulis strategy pool (needs 'strategies' and 'model_config')")
    return parse_pool(d, Path(path).name)


def _log2(x: int) -> float:
    return math.log2(max(x, 1))


@dataclass(frozen=True)
class PoolCostModel(FittedCostModel):
    """A FittedCostModel whose fits are a Hydraulis pool's schemes; anchored extrapolation and the pool's memory
    regression elsewhere (module docstring). Build with `pool_cost_model`."""

    pool: HydraulisPool | None = None

    def __reduce__(self):
        return (_rebuild_pool, (self.model, self.cluster, self.fallback, self.pool))

    def _on_pool_device(self, device: DeviceType) -> bool:
        return device.name == self.pool.device

    def anchor(self, scheme: ParallelScheme) -> PoolScheme:
        """The profiled scheme an unprofiled one is extrapolated from: same TP first, then nearest PP, then TP."""
        return min(self.pool.schemes, key=lambda s: (s.tp != scheme.tp, abs(_log2(s.pp) - _log2(scheme.pp)),
                                                     abs(_log2(s.tp) - _log2(scheme.tp)), s.pp, s.tp))

    def coeffs(self, scheme: ParallelScheme, device: DeviceType) -> LatencyCoeffs:
        if not self._on_pool_device(device):
            return self.fallback.coeffs(scheme, device)
        fit = self.fits.get(str(scheme))
        if fit is not None:
            return fit.coeffs
        anc = self.anchor(scheme)
        k_anc = anc.coeffs()
        ana_t = self.fallback.coeffs(scheme, device)
        ana_a = self.fallback.coeffs(ParallelScheme(anc.tp, anc.pp, 1), device)
        terms = []
        for p, t, a in zip((k_anc.a, k_anc.b, k_anc.c), (ana_t.a, ana_t.b, ana_t.c), (ana_a.a, ana_a.b, ana_a.c)):
            terms.append(p * t / a if a > 0 else t)
        return LatencyCoeffs(*terms)

    def max_len(self, scheme: ParallelScheme, device: DeviceType) -> int:
        if not self._on_pool_device(device):
            return self.fallback.max_len(scheme, device)
        return pool_max_len(self.pool, scheme, self.cluster.num_devices)

    def describe(self) -> str:
        return (f"Hydraulis pool {self.pool.name} on {self.pool.device} ({len(self.pool.schemes)} schemes: "
                f"{', '.join(f'tp{s.tp}pp{s.pp}' for s in self.pool.schemes)}); others anchored on the nearest "
                f"profiled scheme x analytic ratio")


def pool_max_len(pool: HydraulisPool, scheme: ParallelScheme, n_devices: int) -> int:
    """MaxLen of `scheme` under the pool's memory regression (module docstring)."""
    t, p, c = scheme.tp, scheme.pp, scheme.cp
    layers = max(scheme.stage_layers(pool.layers)) if scheme.layer_split is None or sum(
        scheme.layer_split) == pool.layers else max(scheme.layer_split)
    dp = max(1.0, n_devices / (t * p * c))
    states = layers * pool.hidden ** 2 / t * pool.state_bytes * ((1 - pool.alpha) + pool.alpha / dp)
    budget = pool.memory_bound - pool.gap_of(t * c) - pool.safe_bound
    per_tok = pool.act_bytes_of(t) * pool.hidden / (t * c) * layers * p
    if states >= budget:
        return 0
    return max(0, int((budget - states) / per_tok))


def pool_cost_model(pool: HydraulisPool, model: ModelSpec, cluster: ClusterSpec,
                    fallback: AnalyticCostModel | None = None) -> PoolCostModel:
    """The pool as a cost model of `model` on `cluster` (checks that the shapes and device type agree)."""
    if (model.hidden, model.layers) != (pool.hidden, pool.layers):
        raise TidalError(f"strategy pool {pool.name} profiles H={pool.hidden}, L={pool.layers}; model {model.name} "
                         f"has H={model.hidden}, L={model.layers} (use a matching model preset or the analytic model)")
    if not any(g.device.name == pool.device for g in cluster.groups):
        raise TidalError(f"strategy pool {pool.name} was profiled on {pool.device}; cluster {cluster.name} has none "
                         f"(use e.g. {pool.device}x{pool.gpus_per_node})")
    fb = fallback or AnalyticCostModel(model, cluster)
    fits = {}
    for s in pool.schemes:
        sc = ParallelScheme(s.tp, s.pp, 1)
        fits[str(sc)] = SchemeFit(s.coeffs(), 0, 0.0, pool_max_len(pool, sc, cluster.num_devices))
    return PoolCostModel(model, cluster, MappingProxyType(fits), fb, pool=pool)


def _rebuild_pool(model, cluster, fallback, pool) -> PoolCostModel:
    return pool_cost_model(pool, model, cluster, fallback)
