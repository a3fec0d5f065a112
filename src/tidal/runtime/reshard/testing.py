"""Seeded random HSPMD annotations and exact references for property tests (numpy only, no torch).

Values are small integers stored in float64, so sums of partial addends are exact and every check is equality.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.runtime.reshard.annotation import DUPLICATE, PARTIAL, Annotation, DistributedStates


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def random_states(rng: np.random.Generator, n: int, ndim: int, partial: bool) -> DistributedStates:
    keys = list(range(ndim)) + [DUPLICATE] + ([PARTIAL] if partial else [])
    degrees: dict[int, int] = {}
    for f in _factors(n):
        k = keys[int(rng.integers(len(keys)))]
        degrees[k] = degrees.get(k, 1) * f
    order = [k for k in rng.permutation(list(degrees)).tolist()] if degrees else []
    return DistributedStates.make(degrees, order)


def random_annotation(rng: np.random.Generator, world: int, ndim: int, partial: bool = True,
                      max_hsize: int = 3) -> Annotation:
    """Random devices (a random subset of the world, random order), HSize 1..max_hsize, random HDim (split, dup or
    partial) with random non-uniform weights, and random bottom-tier states per subgroup (split / dup / partial)."""
    k = int(rng.integers(1, world + 1))
    devs = rng.permutation(world)[:k].tolist()
    h = int(rng.integers(1, min(max_hsize, k) + 1))
    cuts = sorted(rng.choice(np.arange(1, k), size=h - 1, replace=False).tolist()) if h > 1 else []
    bounds = [0] + cuts + [k]
    parts = [devs[bounds[i]:bounds[i + 1]] for i in range(h)]
    choices = [DUPLICATE] + list(range(ndim)) + ([PARTIAL] if partial else [])
    hdim = choices[int(rng.integers(len(choices)))]
    weights = None
    if hdim >= 0 and h > 1 and rng.random() < 0.6:
        weights = [int(x) for x in rng.integers(1, 4, size=h)]
    states = [random_states(rng, len(p), ndim, partial) for p in parts]
    return Annotation.union(zip(parts, states), hdim, weights)


def random_shape(rng: np.random.Generator, max_ndim: int = 3, max_size: int = 12) -> tuple[int, ...]:
    nd = int(rng.integers(1, max_ndim + 1))
    return tuple(int(x) for x in rng.integers(1, max_size + 1, size=nd))


def make_global(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    return rng.integers(-50, 51, size=tuple(shape)).astype(np.float64)


def shard(ann: Annotation, value: np.ndarray, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Each device's local shard of `value` under `ann`: random integer addends summing to the value for partials."""
    entries = ann.entries(value.shape)
    addends = {}
    for fam in sorted({ann.family(e.addend) for e in entries}):
        keys = sorted({e.addend for e in entries if ann.family(e.addend) == fam})
        rest = value.copy()
        for key in keys[:-1]:
            addends[key] = rng.integers(-20, 21, size=value.shape).astype(np.float64)
            rest = rest - addends[key]
        addends[keys[-1]] = rest
    return {e.device: addends[e.addend][tuple(slice(a, b) for a, b in e.box)].copy() for e in entries}


def check(ann: Annotation, value: np.ndarray, shards: dict[int, np.ndarray | None]) -> str | None:
    """None if `shards` is a correct layout of `value` under `ann`; else a one-line reason. Non-partial: every device
    holds exactly its slice. Partial: duplicates agree and the addends sum to the value."""
    entries = ann.entries(value.shape)
    per_addend: dict[tuple, np.ndarray] = {}
    for e in entries:
        x = shards.get(e.device)
        want_shape = tuple(b - a for a, b in e.box)
        if x is None or tuple(x.shape) != want_shape:
            return f"device {e.device}: shape {None if x is None else x.shape}, expected {want_shape}"
        sl = tuple(slice(a, b) for a, b in e.box)
        if not ann.is_partial():
            if not np.array_equal(x, value[sl]):
                return f"device {e.device}: wrong values in box {e.box}"
            continue
        acc = per_addend.setdefault(e.addend, np.full(value.shape, np.nan))
        prev = acc[sl]
        if not np.all(np.isnan(prev) | (prev == x)):
            return f"device {e.device}: duplicate of addend {e.addend} disagrees in box {e.box}"
        acc[sl] = x
    if ann.is_partial():
        for fam in sorted({ann.family(k) for k in per_addend}):
            parts = [v for k, v in per_addend.items() if ann.family(k) == fam]
            region = ann.region(fam, value.shape) if ann.hdim >= 0 else tuple((0, s) for s in value.shape)
            sl = tuple(slice(a, b) for a, b in region)
            total = sum(parts)[sl]
            if np.isnan(total).any() or not np.array_equal(total, value[sl]):
                return f"partial addends of subgroup family {fam} do not sum to the value"
    return None


def random_case(seed: int, world: int) -> tuple[tuple[int, ...], Annotation, Annotation, np.ndarray,
                                                 dict[int, np.ndarray]]:
    """(shape, src, dst, global value, source shards). A third of the cases keep the source's device groups (and half
    of those its HDim) so the bottom and top tiers and their collectives are exercised, not only BSR."""
    rng = np.random.default_rng(seed)
    shape = random_shape(rng)
    nd = len(shape)
    src = random_annotation(rng, world, nd, partial=bool(rng.random() < 0.5))
    if rng.random() < 0.35:
        keys = [DUPLICATE, PARTIAL] + list(range(nd))
        hdim = src.hdim if rng.random() < 0.5 else keys[int(rng.integers(len(keys)))]
        states = tuple(random_states(rng, len(g), nd, bool(rng.random() < 0.2)) for g in src.groups)
        dst = Annotation(src.groups, states, hdim, src.hweights if hdim == src.hdim else None)
    else:
        dst = random_annotation(rng, world, nd, partial=bool(rng.random() < 0.15))
    value = make_global(rng, shape)
    return shape, src, dst, value, shard(src, value, rng)
