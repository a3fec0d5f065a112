"""Hierarchical communication resolution (Hetu v2 §4) as pure functions: (src, dst, topology) -> CommPlan.

Tier selection follows Figure 4:
- `identity`: src == dst.
- `bottom`: same HSize, HDim and HDim weights. Each sharding subgroup resolves alone: identity when DS and DG match,
  SR (position-wise send) when only the DG differs, collectives (AR / RS / AG) when only the DS differs, BSR otherwise.
- `top`: same HSize and DG union, different HDim: collectives may span subgroups (SplitAR / SplitRS / SplitAG, and
  their bottom-tier forms when a group stays inside one subgroup).
- `bsr`: everything else (different DG union or HSize).

Inside a tier, the tensor is cut into the finest-grained cells of all source and destination boxes (the BSR table).
Every cell has addends (one per partial addend of the source, each with its holders) and needers (destination devices
that must end with its value). A cell whose needers are exactly one holder per addend (plus zero-contributing
members) joins an AR; a cell needed by one contributor joins an RS over the contributors; a cell with one addend that
some needers hold and others do not joins an AG over its needers. Groups are kept only when every member's chunk is
the same size (what the collectives require); other cells fall back to point-to-point reduction at a root followed by
BSR with the three heuristics of §4.3 (local copy first, fastest link, balanced send load).

A partial destination receives the value on its first addend (first subgroup, partial coordinate 0); the other
addends hold zeros. A destination identical to the source keeps its addends untouched.
"""

from __future__ import annotations

import gc
import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidal.core.errors import TidalError
from tidal.runtime.reshard.annotation import PARTIAL, Annotation, Box, Entry, box_size
from tidal.runtime.reshard.bsr import Load, Topology, add_collective, add_p2p, choose_root, choose_sender
from tidal.runtime.reshard.plan import Cell, Collective, CommPlan, Message, RankStats, Reduction, TensorMove


def classify(src: Annotation, dst: Annotation) -> str:
    if src == dst:
        return "identity"
    if src.hsize == dst.hsize and src.hdim == dst.hdim and src.hweights == dst.hweights:
        return "bottom"
    if src.hsize == dst.hsize and all(a.devices == b.devices for a, b in zip(src.groups, dst.groups)):
        return "top"
    return "bsr"


@dataclass
class _Analysis:
    """Load-independent result of one (sub)problem; memoised per (src, dst, shape, subgroup)."""

    copies: list[tuple[int, Box]]
    sr: list[tuple[int, int, Box]]  # (sender, receiver, box) position-wise sends
    collectives: list[tuple]  # (kind, ranks, chunks, contributors per box, writers per box)
    reduces: list[tuple[Box, int, tuple[int, ...], tuple[int, ...]]]  # box, elems, contributors, needers
    transfers: list[tuple[Box, int, tuple[int, ...], tuple[int, ...]]]  # box, elems, holders, needers lacking it
    # Parts whose sender / root admits no choice, grouped per rank pair once (settled by `_settle`).
    fixed_bsr: dict = field(default_factory=dict)  # (sender, receiver) -> [boxes, elems]
    fixed_red: dict = field(default_factory=dict)
    fixed_reductions: list = field(default_factory=list)  # (box, root, contributors)
    dsend: dict = field(default_factory=lambda: defaultdict(int))  # rank -> elems sent by the fixed parts
    drecv: dict = field(default_factory=lambda: defaultdict(int))


def _book(book: dict, key: tuple, box: Box, elems: int) -> None:
    entry = book.get(key)
    if entry is None:
        book[key] = [[box], elems]
    else:
        entry[0].append(box)
        entry[1] += elems


def _settle(a: _Analysis, heuristics: bool) -> _Analysis:
    """Move transfers with a single holder and reductions whose root is forced into the per-pair fixed books, with
    the load they add, so planning many tensors touches each rank pair once per tensor instead of every cell."""
    transfers, reduces = [], []
    for box, elems, hs, lacking in a.transfers:
        if len(hs) == 1:
            for n in lacking:
                _book(a.fixed_bsr, (hs[0], n), box, elems)
                a.dsend[hs[0]] += elems
                a.drecv[n] += elems
        else:
            transfers.append((box, elems, hs, lacking))
    for box, elems, ct, nd in a.reduces:
        pool = [c for c in ct if c in nd] or (list(nd) if len(nd) == 1 else list(ct))
        if len(pool) > 1 and heuristics:
            reduces.append((box, elems, ct, nd))
            continue
        root = min(pool)
        a.fixed_reductions.append((box, root, ct))
        for c in ct:
            if c != root:
                _book(a.fixed_red, (c, root), box, elems)
                a.dsend[c] += elems
                a.drecv[root] += elems
        for n in nd:
            if n == root:
                a.copies.append((n, box))
            else:
                _book(a.fixed_bsr, (root, n), box, elems)
                a.dsend[root] += elems
                a.drecv[n] += elems
    a.transfers, a.reduces = transfers, reduces
    return a


def _ag_groups(nd: tuple[int, ...], items: list) -> list[tuple[tuple[int, ...], dict[int, list]]]:
    """All-gather groups for cells every member of `nd` needs. If each cell has r holders in `nd` and the j-th holders
    of all cells form r disjoint sets covering `nd` (replicas, e.g. {dup:2, split:2} -> {dup:4}), gather within each
    replica set (r AGs); otherwise one AG over `nd` with each cell sourced by its lowest holder."""
    rs = {len(ins) for _, ins in items}
    if len(rs) == 1 and (r := rs.pop()) > 1:
        reps = [{ins[j] for _, ins in items} for j in range(r)]
        if sum(len(x) for x in reps) == len(nd) and set().union(*reps) == set(nd):
            out = []
            for j, rep in enumerate(reps):
                per: dict[int, list] = defaultdict(list)
                for b, ins in items:
                    per[ins[j]].append(b)
                out.append((tuple(sorted(rep)), per))
            return out
    per = defaultdict(list)
    for b, ins in items:
        per[ins[0]].append(b)
    return [(nd, per)]


def _check_move(m: TensorMove) -> None:
    m.src.check_shape(m.shape)
    m.dst.check_shape(m.shape)


class Resolver:
    """Resolves tensor moves on one topology. Holds a memo of per-tensor analyses (pass it around; no globals), at most
    `memo_size` entries, oldest evicted first (activation shapes change every step)."""

    def __init__(self, topology: Topology, itemsize: int = 4, memo_size: int = 4096) -> None:
        if itemsize < 1:
            raise TidalError(f"itemsize must be >= 1, got {itemsize}")
        self.topo = topology
        self.itemsize = itemsize
        self.memo_size = memo_size
        self._memo: dict[tuple, tuple[str, list[_Analysis], dict[int, int]]] = {}

    # ----------------------------------------------------------------------------------------------- analysis
    def analyse(self, move: TensorMove, heuristics: bool = True,
                bsr_only: bool = False) -> tuple[str, list[_Analysis], dict[int, int]]:
        key = (move, heuristics, bsr_only)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        _check_move(move)
        self.topo.check(move.src.devices + move.dst.devices)
        src, dst, shape = move.src, move.dst, move.shape
        tier = classify(src, dst)
        if bsr_only and tier != "identity":
            tier = "bsr"
        se, de = src.entries(shape), dst.entries(shape)
        sub_of = {e.device: e.subgroup for e in se}
        out: list[_Analysis] = []
        if tier == "identity":
            out.append(_Analysis([(e.device, e.box) for e in se if box_size(e.box)], [], [], [], []))
        elif tier == "bottom":
            for g in range(src.hsize):
                sg = [e for e in se if e.subgroup == g]
                dg = [e for e in de if e.subgroup == g]
                if src.states[g] == dst.states[g]:
                    a = _Analysis([], [], [], [], [])
                    for s, d in zip(sg, dg):  # same DS: position i holds the same box and addend
                        if not box_size(s.box):
                            continue
                        (a.copies.append((s.device, s.box)) if s.device == d.device
                         else a.sr.append((s.device, d.device, s.box)))
                    out.append(a)
                else:
                    same_dg = src.groups[g].devices == dst.groups[g].devices
                    out.append(self._cells(sg, dg, src, dst, collectives=same_dg, heuristics=heuristics))
        else:
            out.append(self._cells(se, de, src, dst, collectives=(tier == "top"), heuristics=heuristics))
        res = (tier, [_settle(a, heuristics) for a in out], sub_of)
        if len(self._memo) >= self.memo_size:
            del self._memo[next(iter(self._memo))]
        self._memo[key] = res
        return res

    def _cells(self, se: list[Entry], de: list[Entry], src: Annotation, dst: Annotation, collectives: bool,
               heuristics: bool) -> _Analysis:
        se = [e for e in se if box_size(e.box) > 0]
        de = [e for e in de if box_size(e.box) > 0]
        out = _Analysis([], [], [], [], [])
        if not de:
            return out
        if dst.hdim == PARTIAL:  # the value goes to the first subgroup's first addend, the rest hold zeros
            first = min(e.addend for e in de)
            need = [e for e in de if e.addend == first]
        else:  # every subgroup holds the value on its partial coordinate 0
            need = [e for e in de if e.addend[1] == 0]
        ndim = len(need[0].box)
        cuts = [sorted({x for e in se + need for x in e.box[d]}) for d in range(ndim)]
        pos = [{x: i for i, x in enumerate(c)} for c in cuts]

        def cells_of(box: Box):
            return itertools.product(*[range(pos[d][a], pos[d][b]) for d, (a, b) in enumerate(box)])

        # cell -> family -> addend -> holders. Addends of one family sum to the value; families are alternatives.
        holders: dict[tuple, dict] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
        needers: dict[tuple, list[int]] = defaultdict(list)
        for e in need:
            for c in cells_of(e.box):
                needers[c].append(e.device)
        for e in se:
            fam = src.family(e.addend)
            for c in cells_of(e.box):
                if c in needers:
                    holders[c][fam][e.addend].append(e.device)

        def pick(c: tuple, nd: tuple[int, ...]) -> dict:
            fams = holders.get(c)
            if not fams:
                raise TidalError("the source annotation does not cover every cell the destination needs")
            whole = sorted({h for f in fams.values() if len(f) == 1 for hs in f.values() for h in hs})
            if whole:
                return {None: whole}
            return min(fams.items(), key=lambda kv: (len(kv[1]), -sum(any(h in nd for h in hs)
                                                                        for hs in kv[1].values()), kv[0]))[1]

        bw = self.topo.bw
        ar: dict[tuple, list] = defaultdict(list)
        rs: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
        ag: dict[tuple, list] = defaultdict(list)  # needers -> [(box, holders among them)]
        for c in sorted(needers):
            box = tuple((cuts[d][i], cuts[d][i + 1]) for d, i in enumerate(c))
            elems = box_size(box)
            nd = tuple(sorted(needers[c]))
            adds = pick(c, nd)
            if len(adds) == 1:
                hs = tuple(sorted(next(iter(adds.values()))))
                lacking = tuple(n for n in nd if n not in hs)
                inside = [h for h in hs if h in nd]
                for n in nd:
                    if n in hs:
                        out.copies.append((n, box))
                if not lacking:
                    continue
                if collectives and len(nd) >= 2 and inside:
                    ag[nd].append((box, tuple(sorted(inside))))
                else:
                    out.transfers.append((box, elems, hs, lacking))
                continue
            contrib = []
            for _a, hs in sorted(adds.items()):
                inside = [h for h in hs if h in nd]
                if inside or not heuristics:
                    contrib.append(min(inside or hs))
                else:
                    contrib.append(min(hs, key=lambda h: (-bw[h][nd[0]] if h != nd[0] else float("-inf"), h)))
            ct = tuple(sorted(contrib))
            if collectives and len(nd) >= 2:  # members outside nd contribute their addend and discard the sum
                ar[tuple(sorted(set(nd) | set(ct)))].append((box, ct, nd))
            elif collectives and len(nd) == 1 and nd[0] in ct and len(ct) >= 2:
                rs[ct][nd[0]].append((box, ct))
            else:
                out.reduces.append((box, elems, ct, nd))
        for ranks, items in ar.items():
            out.collectives.append(("AR", ranks, (tuple(b for b, _, _ in items),), tuple((b, c) for b, c, _ in items),
                                    tuple((b, n) for b, _, n in items)))
        for ranks, per in rs.items():
            sizes = {sum(box_size(b) for b, _ in per.get(r, [])) for r in ranks}
            if len(sizes) == 1:
                out.collectives.append(("RS", ranks, tuple(tuple(b for b, _ in per[r]) for r in ranks),
                                        tuple(x for r in ranks for x in per[r]), ()))
            else:
                for r in ranks:
                    out.reduces += [(b, box_size(b), ct, (r,)) for b, ct in per.get(r, [])]
        for nd, items in ag.items():
            for ranks, per in _ag_groups(nd, items):
                sizes = {sum(box_size(b) for b in per.get(r, [])) for r in ranks}
                if len(sizes) == 1:
                    out.collectives.append(("AG", ranks, tuple(tuple(per[r]) for r in ranks), (), ()))
                    continue
                for b in (b for r in ranks for b in per.get(r, [])):  # demote: plain BSR from every holder
                    c = tuple(pos[d][lo] for d, (lo, _) in enumerate(b))
                    hs = tuple(sorted(next(iter(pick(c, ranks).values()))))
                    out.transfers.append((b, box_size(b), hs, tuple(n for n in ranks if n not in hs)))
        return out

    # ------------------------------------------------------------------------------------------------- planning
    def plan(self, moves: Sequence[TensorMove], fused: bool = True, heuristics: bool = True,
             bsr_only: bool = False) -> CommPlan:
        """Plan many tensor moves together. Fused: one BSR table, shared send load, one message per rank pair.
        Unfused: every tensor planned and messaged separately (its own batch). `bsr_only` skips the bottom and top
        tiers (Hetu v2 §6.2 switches graphs with one BSR over all weights, so every replica is a candidate sender)."""
        enabled = gc.isenabled()
        gc.disable()  # planning allocates many small tuples that live as long as the plan; skip cyclic-GC passes
        try:
            return self._plan(tuple(moves), fused, heuristics, bsr_only)
        finally:
            if enabled:
                gc.enable()

    def _plan(self, moves: tuple[TensorMove, ...], fused: bool, heuristics: bool, bsr_only: bool) -> CommPlan:
        tiers: list[str] = []
        copies: list[tuple[int, Cell]] = []
        reductions: list[Reduction] = []
        red: dict[tuple[int, int, int], list] = {}  # (batch, sender, receiver) -> [parts, elems, label]
        p2p: dict[tuple[int, int, int], list] = {}
        cols: list[Collective] = []
        load = Load()
        isz = self.itemsize

        def send(book: dict, key: tuple[int, int, int], part: tuple, elems: int, label: str) -> None:
            entry = book.get(key)
            if entry is None:
                book[key] = [[part], elems, label]
            else:
                entry[0].append(part)
                entry[1] += elems
                if entry[2] != label:
                    entry[2] = "BSR"

        for t, mv in enumerate(moves):
            tier, parts, sub_of = self.analyse(mv, heuristics, bsr_only)
            tiers.append(tier)
            batch = 0 if fused else t
            if not fused:
                load = Load()
            for a in parts:
                copies += [(r, (t, b)) for r, b in a.copies]
                for sd, r, b in a.sr:
                    send(p2p, (batch, sd, r), (t, (b,)), box_size(b), "SR")
                for kind, ranks, chunks, contrib, writers in a.collectives:
                    label = kind
                    if tier == "top" and len({sub_of.get(r, -1) for r in ranks}) > 1:
                        label = "Split" + kind
                    cols.append(Collective(kind, label, ranks, tuple(tuple((t, b) for b in ch) for ch in chunks),
                                           tuple(((t, b), ct) for b, ct in contrib),
                                           tuple(((t, b), w) for b, w in writers)))
                if a.fixed_reductions:
                    reductions.append(Reduction(t, tuple(a.fixed_reductions)))
                for (sd, r), (boxes, elems) in a.fixed_red.items():
                    send(red, (batch, sd, r), (t, tuple(boxes)), elems, "reduce-BSR")
                for (sd, r), (boxes, elems) in a.fixed_bsr.items():
                    send(p2p, (batch, sd, r), (t, tuple(boxes)), elems, "BSR")
                for r, e in a.dsend.items():
                    load.send[r] += e * isz
                for r, e in a.drecv.items():
                    load.recv[r] += e * isz
                chosen = []
                for box, elems, ct, nd in a.reduces:
                    root = choose_root(ct, nd, elems * isz, self.topo, load, heuristics)
                    chosen.append((box, root, ct))
                    for c in ct:
                        if c != root:
                            send(red, (batch, c, root), (t, (box,)), elems, "reduce-BSR")
                    for n in nd:
                        if n == root:
                            copies.append((n, (t, box)))
                        else:
                            load.send[root] += elems * isz
                            send(p2p, (batch, root, n), (t, (box,)), elems, "BSR")
                if chosen:
                    reductions.append(Reduction(t, tuple(chosen)))
                for box, elems, hs, lacking in a.transfers:
                    for n in lacking:
                        sd = choose_sender(hs, n, elems * isz, self.topo, load, heuristics)
                        send(p2p, (batch, sd, n), (t, (box,)), elems, "BSR")
        stats: dict[int, RankStats] = {}
        red_msgs, msgs = [], []
        for book, out in ((red, red_msgs), (p2p, msgs)):
            for (b, sd, r) in sorted(book):
                parts, elems, label = book[b, sd, r]
                out.append(Message(b, sd, r, tuple(parts), elems, label))
                add_p2p(stats, self.topo, sd, r, elems * isz)
                stats[sd].messages += 1
        for col in cols:
            add_collective(stats, self.topo, col, isz)
        return CommPlan(moves, isz, tuple(tiers), tuple(reductions), tuple(red_msgs), tuple(cols), tuple(msgs),
                        tuple(copies), stats)


def resolve(src: Annotation, dst: Annotation, shape: Sequence[int], topology: Topology | None = None,
            itemsize: int = 4, heuristics: bool = True) -> CommPlan:
    """Plan moving one tensor of global `shape` from `src` to `dst`."""
    shape = tuple(int(s) for s in shape)
    if topology is None:
        topology = Topology.uniform(max(src.devices + dst.devices) + 1)
    return Resolver(topology, itemsize).plan([TensorMove(src, dst, shape)], fused=True, heuristics=heuristics)
