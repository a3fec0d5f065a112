"""HSPMD annotations (Hetu v2 §3): device groups, distributed states, unions with HDim/HSize, and the slicing math.

Pure python: no torch, usable on a laptop.

A `DistributedStates` (DS) maps keys to degrees: a key >= 0 splits that tensor dimension, `DUPLICATE` (-1) replicates
and `PARTIAL` (-2) stores addends whose sum is the value. `order` lists the keys outermost first: the device at index
i of the group has mixed-radix coordinates of i over the degrees in that order (the last key varies fastest).

An `Annotation` is a union of (DeviceGroup, DS) sharding subgroups plus the top tier: `hdim` is the dimension the
subgroups split the tensor along (`DUPLICATE`: every subgroup holds the whole tensor, `PARTIAL`: every subgroup holds an
addend of it). Splits along `hdim` may be non-uniform: `hweights` gives each subgroup's share.

Splits inside a subgroup are as even as possible, earlier shards taking the remainder (torch.tensor_split). Weighted
splits use boundaries floor(n * cumulative_weight / total_weight).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidal.core.errors import TidalError

DUPLICATE = -1
PARTIAL = -2

Box = tuple[tuple[int, int], ...]  # one [start, stop) range per tensor dimension
# (subgroup, partial coordinate inside it). With hdim PARTIAL all addends of all subgroups sum to the value; otherwise
# every subgroup's own addends sum to the value (over the subgroup's region) and subgroups are alternatives.
Addend = tuple[int, int]


def key_name(key: int) -> str:
    return {DUPLICATE: "dup", PARTIAL: "partial"}.get(key, f"split{key}")


def split_range(start: int, stop: int, parts: int, index: int) -> tuple[int, int]:
    """Range of shard `index` of `parts` of [start, stop), tensor_split style (earlier shards take the remainder)."""
    q, r = divmod(stop - start, parts)
    lo = start + index * q + min(index, r)
    return lo, lo + q + (1 if index < r else 0)


def owner_range(lo: int, hi: int, rows: int, parts: int) -> range:
    """Indices i whose `split_range(0, rows, parts, i)` meets [lo, hi): the inverse of the tensor_split formula."""
    if hi <= lo:
        return range(0)
    q, r = divmod(rows, parts)
    big = r * (q + 1)  # rows of the first r (larger) shards

    def of(x: int) -> int:
        return x // (q + 1) if x < big else r + (x - big) // q

    return range(of(lo), of(hi - 1) + 1)


def weighted_range(start: int, stop: int, weights: tuple[int, ...], index: int) -> tuple[int, int]:
    n, total = stop - start, sum(weights)
    before = sum(weights[:index])
    return start + n * before // total, start + n * (before + weights[index]) // total


@dataclass(frozen=True)
class DeviceGroup:
    """An ordered list of distinct device ids (ranks)."""

    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        if not self.devices:
            raise TidalError("a device group needs at least one device")
        if len(set(self.devices)) != len(self.devices) or min(self.devices) < 0:
            raise TidalError(f"device group {list(self.devices)} must list distinct non-negative device ids")

    def __len__(self) -> int:
        return len(self.devices)

    def index(self, device: int) -> int:
        return self.devices.index(device)


@dataclass(frozen=True)
class DistributedStates:
    """Bottom-tier sharding of one subgroup: key -> degree, with a device-mapping order (outermost first)."""

    states: tuple[tuple[int, int], ...] = ()
    order: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        states = tuple(sorted((int(k), int(v)) for k, v in self.states if int(v) != 1))
        keys = [k for k, _ in states]
        for k, v in states:
            if k < PARTIAL:
                raise TidalError(f"bad distributed-states key {k}: use a dim >= 0, DUPLICATE (-1) or PARTIAL (-2)")
            if v < 1:
                raise TidalError(f"distributed states {dict(states)}: degree of {key_name(k)} must be >= 1, got {v}")
        order = tuple(int(k) for k in self.order if int(k) in keys) if self.order else ()
        if self.order and (len(set(order)) != len(order) or set(order) != set(keys)):
            raise TidalError(f"distributed states order {list(self.order)} must list each key of {dict(states)} once")
        if not order:  # default: partial, then duplicate, then split dims outermost-first (splits vary fastest)
            order = tuple(sorted(keys))
        object.__setattr__(self, "states", states)
        object.__setattr__(self, "order", order)

    @staticmethod
    def make(states: Mapping[int, int] | None = None, order: Iterable[int] = ()) -> DistributedStates:
        return DistributedStates(tuple((states or {}).items()), tuple(order))

    def degree(self, key: int) -> int:
        return dict(self.states).get(key, 1)

    @property
    def device_num(self) -> int:
        return math.prod(v for _, v in self.states)

    @property
    def partial(self) -> int:
        return self.degree(PARTIAL)

    def split_dims(self) -> tuple[int, ...]:
        return tuple(k for k, _ in self.states if k >= 0)

    def coords(self, index: int) -> dict[int, int]:
        """Mixed-radix coordinates of the device at position `index` of the group."""
        out: dict[int, int] = {}
        degrees = dict(self.states)
        for k in reversed(self.order):
            index, out[k] = divmod(index, degrees[k])
        return out

    def __str__(self) -> str:
        degrees = dict(self.states)
        return "{" + ", ".join(f"{key_name(k)}:{degrees[k]}" for k in self.order) + "}"


@dataclass(frozen=True)
class Entry:
    """What one device holds: a box of the global tensor, as addend `addend` of the value."""

    device: int
    box: Box
    addend: Addend
    subgroup: int


@dataclass(frozen=True)
class Annotation:
    """HSPMD annotation: a DG union and DS union with HDim (`hdim`) and HSize (`len(groups)`)."""

    groups: tuple[DeviceGroup, ...]
    states: tuple[DistributedStates, ...]
    hdim: int = DUPLICATE
    hweights: tuple[int, ...] | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = tuple(g if isinstance(g, DeviceGroup) else DeviceGroup(tuple(g)) for g in self.groups)
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "states", tuple(self.states))
        if not groups or len(groups) != len(self.states):
            raise TidalError(f"annotation needs one distributed states per device group: {len(groups)} groups, "
                             f"{len(self.states)} states")
        for g, ds in zip(groups, self.states):
            if ds.device_num != len(g):
                raise TidalError(f"distributed states {ds} need {ds.device_num} devices but group {list(g.devices)} "
                                 f"has {len(g)}")
        used = [d for g in groups for d in g.devices]
        if len(used) != len(set(used)):
            raise TidalError("sharding subgroups of an annotation must use disjoint devices")
        if self.hdim < PARTIAL:
            raise TidalError(f"bad hdim {self.hdim}: use a dimension >= 0, DUPLICATE (-1) or PARTIAL (-2)")
        if self.hweights is not None:
            w = tuple(int(x) for x in self.hweights)
            if len(w) != len(groups) or min(w) < 1:
                raise TidalError(f"hweights {list(w)} must give one positive weight per subgroup ({len(groups)})")
            if self.hdim < 0:
                raise TidalError("hweights are only meaningful when hdim splits a dimension")
            object.__setattr__(self, "hweights", None if len(set(w)) == 1 else w)
        if len(groups) == 1 and self.hdim != DUPLICATE:  # a single subgroup has no top tier
            object.__setattr__(self, "hdim", DUPLICATE)
            object.__setattr__(self, "hweights", None)
        object.__setattr__(self, "_hash", hash((self.groups, self.states, self.hdim, self.hweights)))

    def __hash__(self) -> int:
        return self._hash

    @staticmethod
    def spmd(devices: Iterable[int], states: Mapping[int, int] | None = None, order: Iterable[int] = ()) -> Annotation:
        return Annotation((DeviceGroup(tuple(devices)),), (DistributedStates.make(states, order),))

    @staticmethod
    def union(parts: Iterable[tuple[Iterable[int], DistributedStates]], hdim: int = DUPLICATE,
              hweights: Iterable[int] | None = None) -> Annotation:
        parts = list(parts)
        return Annotation(tuple(DeviceGroup(tuple(d)) for d, _ in parts), tuple(ds for _, ds in parts), hdim,
                          None if hweights is None else tuple(hweights))

    @property
    def hsize(self) -> int:
        return len(self.groups)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for g in self.groups for d in g.devices)

    def family(self, addend: Addend) -> int:
        """Addends of the same family sum to the value; different families hold the value independently."""
        return 0 if self.hdim == PARTIAL else addend[0]

    def is_partial(self) -> bool:
        return (self.hdim == PARTIAL) or any(ds.partial > 1 for ds in self.states)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        nd = len(shape)
        if any(s < 0 for s in shape):
            raise TidalError(f"shape {list(shape)} has a negative size")
        if self.hdim >= nd:
            raise TidalError(f"hdim {self.hdim} is out of range for a {nd}-d tensor of shape {list(shape)}")
        for ds in self.states:
            for d in ds.split_dims():
                if d >= nd:
                    raise TidalError(f"distributed states {ds} split dim {d} of a {nd}-d tensor {list(shape)}")

    def region(self, g: int, shape: tuple[int, ...]) -> Box:
        """The box subgroup g covers (the whole tensor unless the top tier splits a dimension)."""
        box = [(0, s) for s in shape]
        if self.hdim >= 0:
            n = shape[self.hdim]
            if self.hweights is None:
                box[self.hdim] = split_range(0, n, self.hsize, g)
            else:
                box[self.hdim] = weighted_range(0, n, self.hweights, g)
        return tuple(box)

    def entries(self, shape: tuple[int, ...]) -> list[Entry]:
        """Every device's box and addend, in device-group order."""
        shape = tuple(int(s) for s in shape)
        self.check_shape(shape)
        out = []
        for g, (grp, ds) in enumerate(zip(self.groups, self.states)):
            for dev, (box, j) in zip(grp.devices, subgroup_boxes(ds, self.region(g, shape))):
                out.append(Entry(dev, box, (g, j), g))
        return out

    def local_box(self, device: int, shape: tuple[int, ...]) -> Box | None:
        """The box `device` holds (None if it holds none), without listing every device's entry."""
        shape = tuple(int(s) for s in shape)
        for g, (grp, ds) in enumerate(zip(self.groups, self.states)):
            if device in grp.devices:
                self.check_shape(shape)
                c = ds.coords(grp.index(device))
                box = list(self.region(g, shape))
                for d in ds.split_dims():
                    box[d] = split_range(box[d][0], box[d][1], ds.degree(d), c[d])
                return tuple(box)
        return None

    def local_shape(self, device: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        box = self.local_box(device, shape)
        return None if box is None else tuple(b - a for a, b in box)

    def __str__(self) -> str:
        parts = [f"{list(g.devices)}{ds}" for g, ds in zip(self.groups, self.states)]
        if self.hsize == 1:
            return parts[0]
        h = key_name(self.hdim) + (f"{list(self.hweights)}" if self.hweights else "")
        return f"<{h}: " + " | ".join(parts) + ">"


def subgroup_boxes(ds: DistributedStates, region: Box) -> list[tuple[Box, int]]:
    """(box, partial coordinate) of every device of a subgroup with states `ds` covering `region`, in group order."""
    out = []
    for i in range(ds.device_num):
        c = ds.coords(i)
        box = list(region)
        for d in ds.split_dims():
            box[d] = split_range(box[d][0], box[d][1], ds.degree(d), c[d])
        out.append((tuple(box), c.get(PARTIAL, 0)))
    return out


def box_size(box: Box) -> int:
    return math.prod(b - a for a, b in box)


def intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return None if any(lo >= hi for lo, hi in out) else out


def contains(outer: Box, inner: Box) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner))


def local_box(holder: Box, cell: Box) -> Box:
    """`cell` in the local coordinates of a device holding `holder`."""
    return tuple((c - a, d - a) for (a, _), (c, d) in zip(holder, cell))
