"""The one cache of process groups, owned by the caller and passed explicitly (no global group singletons).

Groups are keyed by their *sorted* global ranks: torch's ``new_group`` sorts the ranks it is given, so a group's
rank order is ascending global rank whatever order the caller lists them in. Code that needs the *layout* order of a
pipeline (TP shard index, CP row block) takes it from :class:`tidal.runtime.pipeline.RankGrid`, never from the
group; :func:`slot_in_group` converts between the two.

Creation is collective over the whole world: every rank must call :meth:`GroupCache.create_all` /
:meth:`GroupCache.ensure` with the same lists in the same order (Megatron does the same; locally synchronised creation
of overlapping groups can deadlock). One cache serves the pipelines of every candidate strategy and the resharding
engine, so one rank set never gets two communicators -- except the resharding engine's point-to-point group
(:meth:`GroupCache.p2p_group`), a communicator of its own over the whole world.

Point-to-point traffic never relies on tags (NCCL ignores them): pipeline activations travel on one group per adjacent
stage pair, the resharding engine's messages on its world-sized p2p group. A ``batch_isend_irecv`` that only some
members of its group join must not be the group's first NCCL call (PyTorch's documented rule), so every p2p group is
initialised with a one-element all-reduce of all its members right after it is created, in creation order (the same
order on every rank, so these blocking collectives cannot deadlock).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from tidal.core.errors import TidalError
from tidal.core.strategy import Pipeline

REDUCE_SCATTER_MODES = ("auto", "native", "allreduce")
# Backends with a native reduce-scatter. gloo gained `reduce_scatter` in PyTorch 2.8 (pytorch/pytorch#149869,
# 2025-03); before that it is all-reduce + slice (same result, twice the traffic).
_NATIVE_RS = ("nccl", "xccl", "ucc", "mpi")


def native_reduce_scatter(backend: str) -> bool:
    """Whether `backend` has a native reduce-scatter: a capability table, never a caught error."""
    b = str(backend).lower()
    if b in _NATIVE_RS:
        return True
    if b == "gloo":
        major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        return (major, minor) >= (2, 8)
    return False


def pipeline_group_ranks(pipeline: Pipeline) -> list[tuple[int, ...]]:
    """Every multi-rank group one pipeline needs, in a fixed order: TP groups, CP groups, the whole pipeline, the
    first/last-stage pairs that sum tied-embedding gradients, and the adjacent stage pairs that carry activations
    (:func:`stage_pairs`)."""
    s, dev = pipeline.scheme, pipeline.device
    out = [tuple(dev(st, c, t) for t in range(s.tp)) for st in range(s.pp) for c in range(s.cp)]
    out += [tuple(dev(st, c, t) for c in range(s.cp)) for st in range(s.pp) for t in range(s.tp)]
    out.append(tuple(pipeline.devices))
    if s.pp > 1:
        out += [(dev(0, c, t), dev(s.pp - 1, c, t)) for c in range(s.cp) for t in range(s.tp)]
    out += stage_pairs(pipeline)
    return [g for g in out if len(g) > 1]


def stage_pairs(pipeline: Pipeline) -> list[tuple[int, int]]:
    """The (stage s, stage s + 1) rank pairs at every (cp, tp) coordinate: one p2p group each (runtime/pp.py)."""
    s, dev = pipeline.scheme, pipeline.device
    return [(dev(st, c, t), dev(st + 1, c, t)) for st in range(s.pp - 1) for c in range(s.cp) for t in range(s.tp)]


def comm_device(group) -> torch.device:
    """Where a buffer for `group`'s backend lives when the caller has no tensor to follow: the current CUDA device
    under NCCL (one GPU per rank, set by the launcher), else the CPU. A capability table, like native_reduce_scatter."""
    if str(dist.get_backend(group)).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def slot_in_group(ranks: Sequence[int], rank: int) -> int:
    """The position of global `rank` in the group over `ranks` (ascending global rank, as torch orders groups)."""
    return sorted(int(r) for r in ranks).index(int(rank))


class GroupCache:
    """Process groups by sorted rank tuple, created once. A group of one rank is ``None`` (no communication).

    `reduce_scatter`: how the resharding engine reduces-and-scatters: "native" uses the collective, "allreduce" an
    all-reduce plus slice, "auto" picks by the group's backend capability (:func:`native_reduce_scatter`).

    `device`: where the one-element warm-up all-reduce of each p2p group runs (default :func:`comm_device`)."""

    def __init__(self, reduce_scatter: str = "auto", device: torch.device | str | None = None) -> None:
        if reduce_scatter not in REDUCE_SCATTER_MODES:
            raise TidalError(f"reduce_scatter must be auto, native or allreduce, got {reduce_scatter!r}")
        self.reduce_scatter = reduce_scatter
        self.device = None if device is None else torch.device(device)
        self._groups: dict[tuple[int, ...], object] = {}
        self._warm: set[tuple[int, ...]] = set()  # p2p groups whose first call (the warm-up collective) has run
        self._p2p = None  # the resharding engine's world-sized p2p group

    def __len__(self) -> int:
        return len(self._groups)

    def ensure(self, ranks_list: Iterable[Sequence[int]]) -> GroupCache:
        """Create missing groups (of two or more ranks). Collective over the world: same list on every rank."""
        for ranks in ranks_list:
            key = tuple(sorted(int(r) for r in ranks))
            if len(key) > 1 and key not in self._groups:
                self._groups[key] = dist.new_group(list(key))
        return self

    def create_all(self, pipelines: Iterable[Pipeline]) -> GroupCache:
        """Every group the given pipelines need (see :func:`pipeline_group_ranks`), then one warm-up collective on
        each adjacent-stage p2p group not yet warmed, in creation order. Collective over the world."""
        pipelines = list(pipelines)
        for p in pipelines:
            self.ensure(pipeline_group_ranks(p))
        for p in pipelines:
            for pair in stage_pairs(p):
                self._warm_up(tuple(sorted(pair)))
        return self

    def _warm_up(self, key: tuple[int, ...]) -> None:
        if key in self._warm:
            return
        self._warm.add(key)
        if dist.get_rank() in key:
            self._initialise(self._groups[key])

    def _initialise(self, group) -> None:
        """The group's first call: a one-element all-reduce that every member joins (blocking)."""
        device = self.device if self.device is not None else comm_device(group)
        dist.all_reduce(torch.zeros(1, device=device), group=group)

    def p2p_group(self):
        """The resharding engine's point-to-point group: every rank of the world, a communicator of its own (apart
        from any collective group over the same ranks), initialised by a world-wide all-reduce. Created on first
        call, so the first call is collective: every rank makes it at the same point (the executor right after
        create_all; otherwise the first reshard execute/start, which every rank calls in the same order)."""
        if self._p2p is None:
            self._p2p = dist.new_group(list(range(dist.get_world_size())))
            self._initialise(self._p2p)
        return self._p2p

    def use_native_reduce_scatter(self, group) -> bool:
        if self.reduce_scatter == "auto":
            return native_reduce_scatter(dist.get_backend(group))
        return self.reduce_scatter == "native"

    def get(self, ranks: Sequence[int]):
        key = tuple(sorted(int(r) for r in ranks))
        if len(key) == 1:
            return None
        if key not in self._groups:
            raise TidalError(f"no process group for ranks {list(key)}; call GroupCache.create_all/ensure on every "
                             f"rank first")
        return self._groups[key]
