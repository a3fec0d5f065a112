"""CommPlan: the inspectable output of communication resolution. Pure python.

A plan moves one or more tensors from a source to a destination annotation in three phases, every rank executing
the parts it takes part in, in plan order:

1. `reductions` + `reduce_msgs`: partial cells not covered by a collective are summed at a root by point-to-point
   messages (BSR with accumulation), one fused message per (batch, sender, receiver).
2. `collectives`: AR / RS / AG (bottom tier) and SplitAR / SplitRS / SplitAG (top tier) on explicit rank groups.
3. `messages` (BSR / SR, one fused message per (batch, sender, receiver)) and `copies` (local moves).

Volumes follow ring algorithms for collectives (ranks ordered by node so only node boundaries cross nodes) and exact
payloads for point-to-point messages.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tidal.core.errors import TidalError
from tidal.runtime.reshard.annotation import Annotation, Box, box_size


@dataclass(frozen=True)
class TensorMove:
    """One tensor of global `shape` moving from annotation `src` to `dst`."""

    src: Annotation
    dst: Annotation
    shape: tuple[int, ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "_hash", hash((self.src, self.dst, self.shape)))

    def __hash__(self) -> int:
        return self._hash


Cell = tuple[int, Box]  # (tensor index in the plan, global box)


@dataclass(frozen=True)
class Reduction:
    """Cells of tensor `tensor` summed at a root: `items` are (box, root, contributors). A root outside the
    contributors starts from zeros."""

    tensor: int
    items: tuple[tuple[Box, int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Message:
    """One point-to-point message: `parts` are (tensor, boxes) packed in order, `elems` elements in all; `batch`
    separates unfused plans."""

    batch: int
    sender: int
    receiver: int
    parts: tuple[tuple[int, tuple[Box, ...]], ...]
    elems: int
    label: str = "BSR"

    @property
    def cells(self) -> list[Cell]:
        return [(t, b) for t, boxes in self.parts for b in boxes]


@dataclass(frozen=True)
class Collective:
    """A collective on `ranks` (in that order). For AR, `chunks[0]` are the cells every member reduces; for RS and
    AG, `chunks[i]` are the cells member i ends with (RS) or contributes (AG). `contrib[c]` lists which members hold
    an addend of cell c (the others contribute zeros); empty for AG. For AR, `writers[c]` lists the members that keep
    the sum (the others only contributed)."""

    kind: str  # AR | RS | AG
    label: str  # AR | RS | AG | SplitAR | SplitRS | SplitAG
    ranks: tuple[int, ...]
    chunks: tuple[tuple[Cell, ...], ...]
    contrib: tuple[tuple[Cell, tuple[int, ...]], ...] = ()
    writers: tuple[tuple[Cell, tuple[int, ...]], ...] = ()

    def chunk_elems(self) -> int:
        return max(sum(box_size(b) for _, b in ch) for ch in self.chunks)


@dataclass
class RankStats:
    send_intra: int = 0
    send_inter: int = 0
    recv_intra: int = 0
    recv_inter: int = 0
    messages: int = 0  # point-to-point messages sent
    collectives: int = 0  # collective calls joined

    @property
    def send(self) -> int:
        return self.send_intra + self.send_inter

    @property
    def recv(self) -> int:
        return self.recv_intra + self.recv_inter


@dataclass(frozen=True)
class RankView:
    """One rank's source / destination box and local shape of every tensor it holds (read-only)."""

    src_box: dict[int, Box]
    dst_box: dict[int, Box]
    src_shape: dict[int, tuple[int, ...]]
    dst_shape: dict[int, tuple[int, ...]]
    want: list = field(default_factory=list)  # per tensor: its input's local shape, None where none is read


def _shape(box: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in box)


@dataclass(frozen=True)
class CommPlan:
    moves: tuple[TensorMove, ...]
    itemsize: int
    tiers: tuple[str, ...]  # per tensor: identity | bottom | top | bsr
    reductions: tuple[Reduction, ...]
    reduce_msgs: tuple[Message, ...]
    collectives: tuple[Collective, ...]
    messages: tuple[Message, ...]
    copies: tuple[tuple[int, Cell], ...]  # (rank, cell): local copy from its source or reduced data
    stats: dict[int, RankStats]
    # A per-rank plan (runtime/reshard/local.py) holds only rank `rank`'s parts, and its (source, destination) box
    # of every tensor; a world plan (rank None) derives a rank's boxes once, on first use (`rank_boxes`).
    rank: int | None = None
    boxes: tuple[tuple[Box | None, Box | None], ...] = ()
    _views: dict = field(default_factory=dict, repr=False, compare=False)

    def rank_boxes(self, rank: int) -> tuple[tuple[Box | None, Box | None], ...]:
        """Rank `rank`'s (source, destination) box of every tensor (None where it holds none)."""
        if self.rank is not None:
            if rank != self.rank:
                raise TidalError(f"plan was made for rank {self.rank}; rank {rank} cannot execute it")
            return self.boxes
        hit = self._views.get(("boxes", rank))
        if hit is None:
            hit = self._views[("boxes", rank)] = tuple(
                (mv.src.local_box(rank, mv.shape), mv.dst.local_box(rank, mv.shape)) for mv in self.moves)
        return hit

    def rank_view(self, rank: int) -> RankView:
        """Rank `rank`'s boxes and local shapes by tensor, built once per plan and rank (what execution looks up
        every step instead of scanning annotations)."""
        hit = self._views.get(rank)
        if hit is None:
            boxes = self.rank_boxes(rank)
            src = {t: b for t, (b, _) in enumerate(boxes) if b is not None}
            dst = {t: b for t, (_, b) in enumerate(boxes) if b is not None}
            src_shape = {t: _shape(b) for t, b in src.items()}
            want = [src_shape.get(t) for t in range(len(self.moves))]
            hit = self._views[rank] = RankView(src, dst, src_shape, {t: _shape(b) for t, b in dst.items()}, want)
        return hit

    @property
    def num_messages(self) -> int:
        return len(self.messages) + len(self.reduce_msgs)

    def op_counts(self) -> Counter:
        c: Counter = Counter(col.label for col in self.collectives)
        c.update(m.label for m in self.messages)
        c.update("reduce-BSR" for _ in self.reduce_msgs)
        if self.copies:
            c["copy"] += len(self.copies)
        return c

    def group_ranks(self) -> list[tuple[int, ...]]:
        """Distinct process groups the plan's collectives need, in first-use order."""
        seen: dict[tuple[int, ...], None] = {}
        for col in self.collectives:
            seen.setdefault(tuple(sorted(col.ranks)), None)
        return list(seen)

    def max_send(self) -> int:
        return max((s.send for s in self.stats.values()), default=0)

    def max_recv(self) -> int:
        return max((s.recv for s in self.stats.values()), default=0)

    def inter_node_bytes(self) -> int:
        return sum(s.send_inter for s in self.stats.values())

    def total_bytes(self) -> int:
        return sum(s.send for s in self.stats.values())

    def summary(self) -> dict:
        return {
            "tensors": len(self.moves), "ops": dict(self.op_counts()), "messages": self.num_messages,
            "collectives": len(self.collectives), "max_send_bytes": self.max_send(), "max_recv_bytes": self.max_recv(),
            "inter_node_bytes": self.inter_node_bytes(), "total_bytes": self.total_bytes(),
        }
