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

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tidal.core.errors import TidalError
from tidal.runtime.reshard.annotation import PARTIAL, Annotation, Box, Entry, box_size
from tidal.runtime.reshard.bsr import (
    Load,
    Topology,
    add_collective,
    choose_root,
    choose_sender,
    fuse,
    message_stats,
)
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


def _check_move(m: TensorMove) -> None:
    m.src.check_shape(m.shape)
    m.dst.check_shape(m.shape)


class Resolver:
    """Resolves tensor moves on one topology. Holds a memo of per-tensor analyses (pass it around; no globals)."""

    def __init__(self, topology: Topology, itemsize: int = 4) -> None:
        if itemsize < 1:
            raise TidalError(f"itemsize must be >= 1, got {itemsize}")
        self.topo = topology
        self.itemsize = itemsize
        self._memo: dict[tuple, tuple[str, list[_Analysis], dict[int, int]]] = {}

    # ----------------------------------------------------------------------------------------------- analysis
    def analyse(self, move: TensorMove, heuristics: bool = True) -> tuple[str, list[_Analysis], dict[int, int]]:
        key = (move, heuristics)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        _check_move(move)
        self.topo.check(move.src.devices + move.dst.devices)
        src, dst, shape = move.src, move.dst, move.shape
        tier = classify(src, dst)
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
        res = (tier, out, sub_of)
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
        ag: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
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
                    ag[nd][min(inside)].append(box)
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
        for ranks, per in ag.items():
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
    def plan(self, moves: Sequence[TensorMove], fused: bool = True, heuristics: bool = True) -> CommPlan:
        """Plan many tensor moves together. Fused: one BSR table, shared send load, one message per rank pair.
        Unfused: every tensor planned and messaged separately (its own batch)."""
        moves = tuple(moves)
        tiers: list[str] = []
        copies: list[tuple[int, Cell]] = []
        reductions: list[Reduction] = []
        red_tr: list[tuple[int, int, int, Cell]] = []
        bsr_tr: list[tuple[int, int, int, Cell]] = []
        sr_tr: list[tuple[int, int, int, Cell]] = []
        cols: list[Collective] = []
        load = Load()
        for t, mv in enumerate(moves):
            tier, parts, sub_of = self.analyse(mv, heuristics)
            tiers.append(tier)
            batch = 0 if fused else t
            if not fused:
                load = Load()
            for a in parts:
                copies += [(r, (t, b)) for r, b in a.copies]
                sr_tr += [(batch, s, r, (t, b)) for s, r, b in a.sr]
                for kind, ranks, chunks, contrib, writers in a.collectives:
                    label = kind
                    if tier == "top" and len({sub_of.get(r, -1) for r in ranks}) > 1:
                        label = "Split" + kind
                    cols.append(Collective(kind, label, ranks, tuple(tuple((t, b) for b in ch) for ch in chunks),
                                           tuple(((t, b), ct) for b, ct in contrib),
                                           tuple(((t, b), w) for b, w in writers)))
                for box, elems, ct, nd in a.reduces:
                    nbytes = elems * self.itemsize
                    root = choose_root(ct, nd, nbytes, self.topo, load, heuristics)
                    cell = (t, box)
                    reductions.append(Reduction(cell, root, ct))
                    red_tr += [(batch, c, root, cell) for c in ct if c != root]
                    for n in nd:
                        if n == root:
                            copies.append((n, cell))
                        else:
                            load.send[root] += nbytes
                            bsr_tr.append((batch, root, n, cell))
                for box, elems, hs, lacking in a.transfers:
                    nbytes = elems * self.itemsize
                    for n in lacking:
                        s = choose_sender(hs, n, nbytes, self.topo, load, heuristics)
                        bsr_tr.append((batch, s, n, (t, box)))
        red_msgs = fuse(red_tr, "reduce-BSR")
        msgs = _merge_pairs(fuse(sr_tr, "SR") + fuse(bsr_tr, "BSR"))
        stats: dict[int, RankStats] = {}

        def elems_of(cell: Cell) -> int:
            return box_size(cell[1])

        message_stats(stats, self.topo, red_msgs, self.itemsize, elems_of)
        message_stats(stats, self.topo, msgs, self.itemsize, elems_of)
        for col in cols:
            add_collective(stats, self.topo, col, self.itemsize)
        return CommPlan(moves, self.itemsize, tuple(tiers), tuple(reductions), tuple(red_msgs), tuple(cols),
                        tuple(msgs), tuple(copies), stats)


def _merge_pairs(msgs: list[Message]) -> list[Message]:
    """An SR and a BSR message between the same pair in the same batch travel as one message."""
    out: dict[tuple[int, int, int], Message] = {}
    for m in msgs:
        k = (m.batch, m.sender, m.receiver)
        if k in out:
            prev = out[k]
            out[k] = Message(m.batch, m.sender, m.receiver, prev.cells + m.cells, prev.label if prev.label == m.label
                             else "BSR")
        else:
            out[k] = m
    return [out[k] for k in sorted(out)]


def resolve(src: Annotation, dst: Annotation, shape: Sequence[int], topology: Topology | None = None,
            itemsize: int = 4, heuristics: bool = True) -> CommPlan:
    """Plan moving one tensor of global `shape` from `src` to `dst`."""
    shape = tuple(int(s) for s in shape)
    if topology is None:
        topology = Topology.uniform(max(src.devices + dst.devices) + 1)
    return Resolver(topology, itemsize).plan([TensorMove(src, dst, shape)], fused=True, heuristics=heuristics)
