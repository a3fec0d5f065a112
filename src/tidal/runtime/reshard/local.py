"""Per-rank LNK pull / push planning from the closed form of the shard ranges (decision 74). Pure python.

`SwitchPlanner.pull/push` resolve the world's moves and every rank keeps the whole plan: O(N^2) work and memory per
candidate. Here one rank derives only its own parts. The master layout is dim 0 of every parameter split over all N
ranks (`shard_range`); a strategy's layout is, per pipeline, the stage(s) holding the parameter (the tied embedding
on its first and last stage), split over TP on the parameter's TP dim and duplicated (pull) or partial (push) over
the CP ranks of those stages. Every row has exactly one owner, so every message is forced:

- pull, receive: my destination box cut by the owners of its rows (`owner_range`, arithmetic);
- pull, send: for my rows, per pipeline, the TP indices whose shard meets them (all of them for a row-parallel
  weight or a norm) times the CP ranks of the holding stages;
- push, owner: my rows cut at every pipeline's TP boundaries (the cells over which the set of addend holders is
  constant); each cell is summed at me from one holder per addend (partial over pipelines and CP ranks): the holder
  itself when I hold that addend, else the only holder (split weight) or, among a norm's TP duplicates, the one with
  the best link to me and then the lowest rank - exactly `Resolver`'s choice, so the plan's reductions, reduce
  messages and bytes equal the global planner's;
- push, holder: the same cells of every owner my gradient box meets, when I am that addend's chosen holder.

A strategy with a single addend (one pipeline, CP 1, no tied stages) has nothing to reduce: holders send straight to
owners. A norm there has TP duplicate holders; the global planner balances its sender by cumulative load over the
world, which no rank can know alone, so the sender is the best-linked duplicate rotated by the owner's rank (same
bytes, a norm's few elements).

Plans are `CommPlan`s holding only this rank's messages, reductions and copies (`rank` set, `boxes` its source and
destination box per tensor), executed unchanged by `execute` / `start`. Layers held by the same stages in every
pipeline share their per-kind pieces (memoised by kind), so planning costs O(own parts). Pulls and pushes are BSR-tier
(as `SwitchPlanner.pull/push`, `bsr_only`): no collectives, so they need no process groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, ParamInfo, param_table
from tidal.core.strategy import Strategy
from tidal.runtime.reshard.annotation import (
    DUPLICATE,
    PARTIAL,
    Annotation,
    Box,
    DeviceGroup,
    DistributedStates,
    owner_range,
    split_range,
)
from tidal.runtime.reshard.bsr import Links
from tidal.runtime.reshard.deduce import StageLayout, stages_of
from tidal.runtime.reshard.plan import CommPlan, Message, RankStats, Reduction, TensorMove


def box_size(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n


def _box(shape: tuple[int, ...], dim: int | None, parts: int, index: int) -> Box:
    box = [(0, s) for s in shape]
    if dim is not None:
        box[dim] = split_range(0, shape[dim], parts, index)
    return tuple(box)


def _cuts(n: int, degrees, lo: int, hi: int) -> list[int]:
    """[lo, hi) cut at every boundary of an even split of n into each of `degrees` parts."""
    pts = {lo, hi}
    for d in degrees:
        for i in owner_range(lo, hi, n, d):
            a, b = split_range(0, n, d, i)
            pts.update(x for x in (a, b) if lo < x < hi)
    return sorted(pts)


_first = itemgetter(0)  # a part's tensor index


@dataclass(frozen=True)
class _Held:
    """The stages of one pipeline holding a parameter: their devices (CP outer, TP inner, first stage first)."""

    devices: tuple[int, ...]
    tp: int
    reps: int  # CP ranks over all holding stages: duplicates (pull) / partial addends (push)


class _Book:
    """Point-to-point parts of one direction, kept as (memoised piece list, tensors using it): layers of one kind share
    their pieces [(peer, boxes, elems)], so a part costs one tuple when the messages are built."""

    def __init__(self) -> None:
        self.uses: dict[int, tuple[list, list[int]]] = {}

    def add(self, pieces: list, t: int) -> None:
        e = self.uses.get(id(pieces))
        if e is None:
            self.uses[id(pieces)] = e = (pieces, [])
        e[1].append(t)

    def per_peer(self) -> dict[int, tuple[list, int]]:
        """peer -> (parts in tensor order, elements)."""
        parts: dict[int, list] = defaultdict(list)
        elems: dict[int, int] = defaultdict(int)
        for pieces, ts in self.uses.values():
            k = len(ts)
            for peer, bx, n in pieces:
                parts[peer].extend(zip(ts, repeat(bx)))
                elems[peer] += n * k
        out = {}
        for peer, lst in parts.items():
            lst.sort(key=_first)  # runs of tensor indices, one per piece list; a tensor reaches a peer once
            out[peer] = (lst, elems[peer])
        return out


class LocalPlanner:
    """Plans rank `rank`'s part of the pull and push of `strategy` on a world of `world` ranks."""

    def __init__(self, model: ModelSpec, strategy: Strategy | StageLayout, world: int, rank: int, links: Links,
                 table: Sequence[ParamInfo] | None = None) -> None:
        if not 0 <= rank < world:
            raise TidalError(f"rank {rank} is outside the world of {world}")
        self.model, self.world, self.rank, self.links = model, world, rank, links
        self.table = tuple(table if table is not None else param_table(model))
        self.layout = stages_of(strategy, model)
        if len(links.nodes) < world:
            raise TidalError(f"links cover {len(links.nodes)} ranks, the world has {world}")
        used = [d for stages in self.layout for st in stages for d in st.devices]
        if len(used) != len(set(used)) or (used and (min(used) < 0 or max(used) >= world)):
            raise TidalError(f"strategy devices must be distinct ranks of the world of {world}")
        self._holders: dict[tuple, tuple[_Held, ...]] = {}  # (owner key, tied) -> per pipeline
        self._interned: dict[tuple, tuple[_Held, ...]] = {}
        self._stage_of = self._index_stages()
        self._memo: dict[tuple, object] = {}
        self._ann: dict[tuple, Annotation] = {}
        self._groups: dict[tuple[int, ...], DeviceGroup] = {}
        self._fully = Annotation.spmd(range(world), {0: world})
        me = [(g, st) for g, stages in enumerate(self.layout) for st in stages if rank in st.devices]
        self.my_pipeline = me[0][0] if me else None

    # ------------------------------------------------------------------------------------------------- layout
    def _index_stages(self) -> list[dict]:
        out = []
        for stages in self.layout:
            by = {}
            for s in stages:
                if s.embed:
                    by.setdefault("embed", s)
                if s.head:
                    by["head"] = s
                for layer in range(s.first, s.stop):
                    by[layer] = s
            out.append(by)
        return out

    def holders(self, info: ParamInfo) -> tuple[_Held, ...]:
        """Per pipeline, what holds `info` (deduce.holder_stages); one interned tuple per distinct pattern."""
        key = (info.owner, info.tied_head)
        hit = self._holders.get(key)
        if hit is not None:
            return hit
        out = []
        for by in self._stage_of:
            own = by.get(info.owner)
            if own is None:
                raise TidalError(f"no stage of a pipeline owns {info.name} (owner {info.owner})")
            held = (own,)
            if info.tied_head and by["head"] != own:
                last = by["head"]
                if last.tp != own.tp:
                    raise TidalError(f"tied embedding on stages of TP {own.tp} and {last.tp}: give them equal TP")
                held = (own, last)
            out.append(_Held(tuple(d for st in held for d in st.devices), held[0].tp, sum(st.cp for st in held)))
        pattern = tuple(out)
        pattern = self._interned.setdefault(pattern, pattern)
        self._holders[key] = pattern
        return pattern

    def _annotation(self, pattern: tuple[_Held, ...], info: ParamInfo, grad: bool) -> Annotation:
        """deduce.param_annotation for a holder pattern, with shared device groups."""
        key = (id(pattern), info.tp_dim, grad)
        hit = self._ann.get(key)
        if hit is not None:
            return hit
        rep, split = (PARTIAL if grad else DUPLICATE), info.tp_dim
        groups, states = [], []
        for h in pattern:
            if split is None:
                deg, order = ({rep: h.reps, DUPLICATE: h.tp}, (rep, DUPLICATE)) if grad else \
                    ({DUPLICATE: h.reps * h.tp}, (DUPLICATE,))
            else:
                deg, order = {rep: h.reps, split: h.tp}, (rep, split)
            groups.append(self._groups.setdefault(h.devices, DeviceGroup(h.devices)))
            states.append(DistributedStates.make(deg, order))
        ann = Annotation(tuple(groups), tuple(states), PARTIAL if grad else DUPLICATE)
        self._ann[key] = ann
        return ann

    def _mine(self, pattern: tuple[_Held, ...], info: ParamInfo) -> tuple[int, int, int] | None:
        """(pipeline, partial / duplicate coordinate, TP index) of this rank for a parameter, or None."""
        g = self.my_pipeline
        if g is None:
            return None
        h = pattern[g]
        try:
            k = h.devices.index(self.rank)
        except ValueError:
            return None
        return g, k // h.tp, k % h.tp

    # --------------------------------------------------------------------------------------------------- pull
    def _pull_sends(self, pattern: tuple[_Held, ...], info: ParamInfo, mine: Box) -> list:
        """[(receiver, (box,), elems)] of my rows to every holder (memoised per pattern and kind)."""
        key = ("ps", id(pattern), info.shape, info.tp_dim)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        out = []
        shape, d = info.shape, info.tp_dim
        lo, hi = mine[0]
        for h in pattern:
            for j in owner_range(lo, hi, shape[0], h.tp) if d == 0 else range(h.tp):
                b = _box(shape, d, h.tp, j)
                box = ((max(lo, b[0][0]), min(hi, b[0][1])),) + b[1:]
                n = box_size(box)
                if n <= 0:
                    continue
                for p in range(h.reps):
                    dev = h.devices[p * h.tp + j]
                    if dev != self.rank:
                        out.append((dev, (box,), n))
        self._memo[key] = out
        return out

    def _pull_recvs(self, info: ParamInfo, dst: Box) -> tuple[list, Box | None]:
        """([(owner, (box,), elems)], the box I copy from my own rows) of my destination box (memoised per kind)."""
        key = ("pr", info.shape, dst)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        n, me, rows = self.world, self.rank, info.shape[0]
        lo, hi = dst[0]
        rest = dst[1:]
        inner = box_size(((0, 1),) + rest)
        out, copy = [], None
        for o in owner_range(lo, hi, rows, n):
            a, b = split_range(0, rows, n, o)
            a, b = max(a, lo), min(b, hi)
            if b <= a or not inner:
                continue
            if o == me:
                copy = ((a, b),) + rest
            else:
                out.append((o, (((a, b),) + rest,), (b - a) * inner))
        self._memo[key] = hit = (out, copy)
        return hit

    def pull(self, indices: Sequence[int] | None = None, itemsize: int = 2) -> CommPlan:
        """This rank's part of pulling parameters `indices` of the table (default: all) from the master layout."""
        idx = list(range(len(self.table))) if indices is None else list(indices)
        sends, recvs = _Book(), _Book()
        copies, moves, boxes = [], [], []
        n, me = self.world, self.rank
        for t, i in enumerate(idx):
            info = self.table[i]
            shape = info.shape
            pattern = self.holders(info)
            moves.append(TensorMove(self._fully, self._annotation(pattern, info, False), shape))
            r0, r1 = split_range(0, shape[0], n, me)
            src = ((r0, r1),) + tuple((0, s) for s in shape[1:])
            pos = self._mine(pattern, info)
            dst = None
            if pos is not None:
                dst = _box(shape, info.tp_dim, pattern[pos[0]].tp, pos[2])
                pieces, copy = self._pull_recvs(info, dst)
                if copy is not None:
                    copies.append((me, (t, copy)))
                recvs.add(pieces, t)
            boxes.append((src, dst))
            if r1 > r0:
                sends.add(self._pull_sends(pattern, info, src), t)
        return self._finish(moves, itemsize, (), (), sends, recvs, copies, boxes)

    # --------------------------------------------------------------------------------------------------- push
    def _cells(self, degrees: tuple[int, ...], info: ParamInfo, rows: tuple[int, int]) -> tuple[Box, ...]:
        """An owner's rows cut where the holder of some addend changes: every pipeline's TP boundaries."""
        shape, d = info.shape, info.tp_dim
        rest = tuple((0, s) for s in shape[1:])
        if d == 0:
            pts = _cuts(shape[0], degrees, rows[0], rows[1])
            return tuple(((a, b),) + rest for a, b in zip(pts, pts[1:]))
        if d == 1:
            key = ("cols", degrees, shape)
            cols = self._memo.get(key)
            if cols is None:
                pts = _cuts(shape[1], degrees, 0, shape[1])
                cols = self._memo[key] = tuple(zip(pts, pts[1:]))
            return tuple((rows, c) + rest[1:] for c in cols)
        return ((rows,) + rest,)

    def _norm_sender(self, group: tuple[int, ...], owner: int) -> int:
        """Among a norm's TP duplicates, who sends an addend to `owner`: the owner itself if it holds one, else the
        best link to it, then the lowest rank (Resolver's choice)."""
        if owner in group:
            return owner
        bw = self.links.bw
        return min(group, key=lambda x: (-bw(x, owner), x))

    def _single_sender(self, group: tuple[int, ...], owner: int) -> int:
        """One pipeline, one addend, a norm's TP duplicates: the best-linked one, rotated by the owner."""
        bw = self.links.bw
        best = max(bw(x, owner) for x in group)
        cands = sorted(x for x in group if bw(x, owner) == best)
        return cands[owner % len(cands)]

    def _reduce_here(self, pattern: tuple[_Held, ...], degrees: tuple[int, ...], info: ParamInfo,
                     rows: tuple[int, int]):
        """(items, {contributor: cells}) of the reduction of my rows (memoised per pattern and kind)."""
        key = ("red", id(pattern), info.shape, info.tp_dim)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        me, d = self.rank, info.tp_dim
        items, per = [], {}
        for cell in self._cells(degrees, info, rows):
            ct = []
            # the TP index holding the cell, per degree (a cell lies inside one shard of every pipeline)
            js = {} if d is None else {tp: owner_range(cell[d][0], cell[d][1], info.shape[d], tp)[0] for tp in degrees}
            for h in pattern:
                tp, devs = h.tp, h.devices
                if d is not None:
                    ct += devs[js[tp]::tp]
                else:
                    ct += [self._norm_sender(devs[p * tp:(p + 1) * tp], me) for p in range(h.reps)]
            ct = tuple(sorted(ct))
            items.append((cell, me, ct))
            for c in ct:
                if c != me:
                    per.setdefault(c, []).append(cell)
        out = (tuple(items), [(c, tuple(v), sum(box_size(b) for b in v)) for c, v in per.items()])
        self._memo[key] = out
        return out

    def _push_sends(self, degrees: tuple[int, ...], info: ParamInfo, group: tuple[int, ...], src: Box) -> list:
        """[(owner, cells, elems)] of my gradient box, for every owner whose rows it meets (memoised per kind: it
        depends on my box and TP group only, not on which layer)."""
        key = ("pushs", degrees, info.shape, info.tp_dim, group, src)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        n, me, shape, d = self.world, self.rank, info.shape, info.tp_dim
        out = []
        for o in owner_range(src[0][0], src[0][1], shape[0], n):
            if o == me:
                continue
            rows = split_range(0, shape[0], n, o)
            if d is None:
                if self._norm_sender(group, o) != me:
                    continue
                cells = self._cells(degrees, info, rows)
            elif d == 0:
                cells = self._cells(degrees, info, (max(rows[0], src[0][0]), min(rows[1], src[0][1])))
            else:
                lo, hi = src[1]
                cells = tuple(c for c in self._cells(degrees, info, rows) if lo <= c[1][0] and c[1][1] <= hi)
            elems = sum(box_size(b) for b in cells)
            if elems:
                out.append((o, cells, elems))
        self._memo[key] = out
        return out

    def push(self, indices: Sequence[int] | None = None, itemsize: int = 4) -> CommPlan:
        """This rank's part of pushing the gradients of parameters `indices` of the table (default: all; partial
        over CP ranks, tied stages and pipelines) to their owners, reduced there."""
        idx = list(range(len(self.table))) if indices is None else list(indices)
        n, me = self.world, self.rank
        sends, recvs, rsends, rrecvs = _Book(), _Book(), _Book(), _Book()
        copies, moves, boxes, reductions = [], [], [], []
        for t, i in enumerate(idx):
            info = self.table[i]
            shape, d = info.shape, info.tp_dim
            pattern = self.holders(info)
            moves.append(TensorMove(self._annotation(pattern, info, True), self._fully, shape))
            r0, r1 = split_range(0, shape[0], n, me)
            dst = ((r0, r1),) + tuple((0, s) for s in shape[1:])
            pos = self._mine(pattern, info)
            src = None if pos is None else _box(shape, d, pattern[pos[0]].tp, pos[2])
            boxes.append((src, dst))
            if sum(h.reps for h in pattern) == 1:
                self._push_single(t, info, pattern[0], src, dst, sends, recvs, copies)
                continue
            degrees = tuple(sorted({h.tp for h in pattern}))
            if r1 > r0:  # owner: reduce my rows
                items, per = self._reduce_here(pattern, degrees, info, (r0, r1))
                reductions.append(Reduction(t, items))
                copies += [(me, (t, cell)) for cell, _, _ in items]
                rrecvs.add(per, t)
            if src is None or box_size(src) == 0:
                continue
            h = pattern[pos[0]]
            group = h.devices[pos[1] * h.tp:(pos[1] + 1) * h.tp]
            rsends.add(self._push_sends(degrees, info, group, src), t)
        return self._finish(moves, itemsize, reductions, (rsends, rrecvs), sends, recvs, copies, boxes)

    def _push_single(self, t: int, info: ParamInfo, h: _Held, src: Box | None, dst: Box, sends: _Book,
                     recvs: _Book, copies: list) -> None:
        """One addend: holders send their part of each owner's rows straight to it (no reduction)."""
        key = ("single", info.shape, info.tp_dim, h)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._single_pieces(info, h, src, dst)
        got, out, mine = hit
        copies += [(self.rank, (t, box)) for box in mine]
        recvs.add(got, t)
        sends.add(out, t)

    def _single_pieces(self, info: ParamInfo, h: _Held, src: Box | None, dst: Box) -> tuple[list, list, list]:
        n, me, shape, d = self.world, self.rank, info.shape, info.tp_dim
        rows = dst[0]
        got, out, mine = [], [], []
        if rows[1] > rows[0]:  # owner
            if d is None:
                if me in h.devices:
                    mine.append(dst)
                else:
                    got.append((self._single_sender(h.devices, me), (dst,), box_size(dst)))
            else:
                lo, hi = rows if d == 0 else (0, shape[d])
                for j in owner_range(lo, hi, shape[d], h.tp):
                    b = _box(shape, d, h.tp, j)
                    box = ((max(rows[0], b[0][0]), min(rows[1], b[0][1])),) + b[1:]
                    if box_size(box) <= 0:
                        continue
                    if h.devices[j] == me:
                        mine.append(box)
                    else:
                        got.append((h.devices[j], (box,), box_size(box)))
        if src is not None and box_size(src) > 0:
            for o in owner_range(src[0][0], src[0][1], shape[0], n):
                if o == me:
                    continue
                a, b = split_range(0, shape[0], n, o)
                box = ((max(a, src[0][0]), min(b, src[0][1])),) + src[1:]
                if box_size(box) <= 0:
                    continue
                if d is None and (o in h.devices or self._single_sender(h.devices, o) != me):
                    continue
                out.append((o, (box,), box_size(box)))
        return got, out, mine

    # ------------------------------------------------------------------------------------------------- output
    def _finish(self, moves, itemsize, reductions, red, sends, recvs, copies, boxes) -> CommPlan:
        me, nodes = self.rank, self.links.nodes
        st = RankStats()

        def book(out: list, pairs: _Book, sending: bool, label: str) -> None:
            # Every piece list is memoised for the planner's life, so (list, tensors) names the messages: the
            # per-layer pulls of layers held alike (same local tensor indices) share their Message objects.
            key = ("book", sending, label, itemsize, tuple((id(p), tuple(ts)) for p, ts in pairs.uses.values()))
            hit = self._memo.get(key)
            if hit is None:
                msgs, delta = [], [0, 0, 0, 0, 0]
                for peer, (parts, elems) in pairs.per_peer().items():
                    s, r = (me, peer) if sending else (peer, me)
                    msgs.append(Message(0, s, r, tuple(parts), elems, label))
                    inter = nodes[s] != nodes[r]
                    delta[(0 if sending else 2) + inter] += elems * itemsize
                    delta[4] += sending
                hit = self._memo[key] = (msgs, delta)
            out += hit[0]
            d = hit[1]
            st.send_intra += d[0]
            st.send_inter += d[1]
            st.recv_intra += d[2]
            st.recv_inter += d[3]
            st.messages += d[4]

        red_msgs: list[Message] = []
        msgs: list[Message] = []
        if red:
            book(red_msgs, red[0], True, "reduce-BSR")
            book(red_msgs, red[1], False, "reduce-BSR")
        book(msgs, sends, True, "BSR")
        book(msgs, recvs, False, "BSR")
        red_msgs.sort(key=_pair)
        msgs.sort(key=_pair)
        return CommPlan(tuple(moves), itemsize, ("bsr",) * len(moves), tuple(reductions), tuple(red_msgs), (),
                        tuple(msgs), tuple(copies), {me: st}, rank=me, boxes=tuple(boxes))


def _pair(m: Message) -> tuple[int, int]:
    return m.sender, m.receiver


__all__ = ["Links", "LocalPlanner", "owner_range"]
