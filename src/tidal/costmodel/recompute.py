"""Activation recomputation priced for the planner (decision 90): a cost model whose schemes may recompute.

:class:`RecomputeCostModel` wraps a cost model with an analytic memory charge (``memory``: AnalyticCostModel, or
anything with that field). Per scheme it picks the recomputation mode (:meth:`mode`):

* a fixed mode (``"full"``, ``"selective"``, or one per stage "full,none"): every scheme runs it;
* ``"auto"``: a scheme that holds ``need`` tokens without recomputation runs none; otherwise the cheapest mode that
  makes ``need`` fit (selective, then full); a scheme no mode makes fit runs none (and keeps its MaxLen).

``max_len`` is the memory model's under that mode (costmodel/memory.py), ``coeffs`` the base coefficients plus the
extra forward the mode runs in the backward. The base model charges forward + backward = 3 forwards per layer
(costmodel/analytic.py), so one more forward is a third of it:

* full: a, b and c grow by 1/3 (every layer's forward again, its TP/CP collectives included; the head and the PP
  transfers, not recomputed, are charged too: an upper bound);
* selective: a grows by 1/3 (the attention core, the l^2 term, runs again; the linear layers do not).

So the planner weighs a scheme that recomputes against a wider one on the same footing: its MaxLen grows, its time
per token grows by the forward it repeats. With a fixed mode of "none" the wrapper answers exactly what the base does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tidal.core.cluster import DeviceType
from tidal.core.errors import TidalError
from tidal.core.recompute import parse_recompute, stage_recompute
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.base import LatencyCoeffs, Wrapper
from tidal.costmodel.memory import AUTO_ORDER, auto_recompute

# extra fraction of (a, b, c) a recomputation mode adds to forward + backward (module docstring)
EXTRA = {"none": (0.0, 0.0, 0.0), "selective": (1 / 3, 0.0, 0.0), "full": (1 / 3, 1 / 3, 1 / 3)}


@dataclass(frozen=True)
class RecomputeCostModel(Wrapper):
    base: object  # a cost model with a `memory` field (AnalyticCostModel)
    recompute: str = "auto"  # "auto" or a mode / per-stage modes (core/recompute.py)
    need: int = 0  # auto: the micro-batch tokens a scheme must hold (the longest sequence: [data] max_len)

    def __post_init__(self) -> None:
        if getattr(self.base, "memory", None) is None:
            raise TidalError(f"recompute pricing needs a cost model with an analytic memory charge, got "
                             f"{type(self.base).__name__}")
        if self.recompute != "auto":
            parse_recompute(self.recompute)
        elif self.need < 1:
            raise TidalError(f"recompute auto needs the length a scheme must hold (need >= 1), got {self.need}")

    def _with(self, modes: tuple[str, ...]):
        return replace(self.base, memory=replace(self.base.memory, recompute=modes))

    def modes(self, scheme: ParallelScheme, device: DeviceType) -> tuple[str, ...]:
        """The per-stage modes `scheme` runs (one entry per stage)."""
        if self.recompute != "auto":
            fixed = parse_recompute(self.recompute)
            return tuple(stage_recompute(fixed, s) for s in range(scheme.pp))
        mem = replace(self.base.memory, recompute="auto", recompute_need=self.need)
        return auto_recompute(self.model, scheme, device, self.cluster.num_devices, mem)

    def mode(self, scheme: ParallelScheme, device: DeviceType) -> str:
        """The costliest mode of any stage of `scheme` (what its slowest stage is priced with)."""
        return max(self.modes(scheme, device), key=AUTO_ORDER.index)

    def coeffs(self, scheme: ParallelScheme, device: DeviceType) -> LatencyCoeffs:
        c = self.base.coeffs(scheme, device)
        ea, eb, ec = EXTRA[self.mode(scheme, device)]
        if ea == eb == ec == 0.0:
            return c
        return LatencyCoeffs(c.a * (1 + ea), c.b * (1 + eb), c.c * (1 + ec), c.d * (1 + ec))

    def max_len(self, scheme: ParallelScheme, device: DeviceType) -> int:
        return self._with(self.modes(scheme, device)).max_len(scheme, device)


__all__ = ["EXTRA", "RecomputeCostModel"]
