"""Strategy: pipelines, each a ParallelScheme placed on concrete devices, topology-aware (TP inside a node)."""

from __future__ import annotations

from dataclasses import dataclass

from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import ParallelScheme, format_strategy


@dataclass(frozen=True)
class Pipeline:
    scheme: ParallelScheme
    # Device of (stage s, cp rank c, tp rank t) is devices[(s * cp + c) * tp + t]: TP fastest, then CP, then stage.
    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.devices) != self.scheme.num_devices:
            raise TidalError(f"pipeline {self.scheme} needs {self.scheme.num_devices} devices, got {len(self.devices)}")

    def device(self, stage: int, cp_rank: int, tp_rank: int) -> int:
        s = self.scheme
        return self.devices[(stage * s.cp + cp_rank) * s.tp + tp_rank]

    def stage_devices(self, stage: int) -> tuple[int, ...]:
        n = self.scheme.cp * self.scheme.tp
        return self.devices[stage * n : (stage + 1) * n]


@dataclass(frozen=True)
class Strategy:
    pipelines: tuple[Pipeline, ...]

    def __post_init__(self) -> None:
        used = [d for p in self.pipelines for d in p.devices]
        if len(used) != len(set(used)):
            raise TidalError("strategy places two pipelines on the same device")

    @property
    def schemes(self) -> tuple[ParallelScheme, ...]:
        return tuple(p.scheme for p in self.pipelines)

    @property
    def num_devices(self) -> int:
        return sum(p.scheme.num_devices for p in self.pipelines)

    def __str__(self) -> str:
        return format_strategy(self.schemes)


def place(schemes: tuple[ParallelScheme, ...], cluster: ClusterSpec, model: ModelSpec | None = None) -> Strategy:
    """Place pipelines on devices. TP groups are the unit: each fills free devices of one node (or whole contiguous
    nodes when TP exceeds a node). Larger pipelines are placed first so they get aligned blocks; the returned pipelines
    keep the order of `schemes`. Raises TidalError when the cluster is too small."""
    if not schemes:
        raise TidalError("a strategy needs at least one pipeline")
    if model is not None:
        for s in schemes:
            s.validate(model)
    need = sum(s.num_devices for s in schemes)
    if need > cluster.num_devices:
        raise TidalError(
            f"strategy {format_strategy(schemes)} needs {need} devices; "
            f"cluster {cluster.name} has {cluster.num_devices}"
        )
    sizes = cluster.node_sizes()
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    free = [list(range(st, st + sz)) for st, sz in zip(starts, sizes)]
    order = sorted(range(len(schemes)), key=lambda i: (-schemes[i].tp, -schemes[i].num_devices, i))
    placed: dict[int, tuple[int, ...]] = {}
    for i in order:
        s = schemes[i]
        devs: list[int] = []
        for _ in range(s.pp * s.cp):
            devs += _take_tp_group(free, s.tp, cluster)
        placed[i] = tuple(devs)
    return Strategy(tuple(Pipeline(schemes[i], placed[i]) for i in range(len(schemes))))


def _take_tp_group(free: list[list[int]], tp: int, cluster: ClusterSpec) -> list[int]:
    # Best fit: the node with the fewest free devices that still holds the whole group.
    fits = [n for n, f in enumerate(free) if len(f) >= tp]
    if fits:
        n = min(fits, key=lambda k: (len(free[k]), k))
        out, free[n][:] = free[n][:tp], free[n][tp:]
        return out
    # Group wider than any node's free space: take whole free nodes in id order, then any free devices.
    out: list[int] = []
    for f in sorted(free, key=lambda f: (-len(f), f[0] if f else 0)):
        take = min(tp - len(out), len(f))
        out += f[:take]
        f[:] = f[take:]
        if len(out) == tp:
            return sorted(out)
    raise TidalError(f"cluster {cluster.name} has too few free devices for a TP={tp} group")
