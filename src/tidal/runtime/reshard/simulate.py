"""Single-process numpy execution of a CommPlan, phase by phase with the same semantics as `execute`. Used as a dry
run on a laptop and by the pure unit tests; the distributed tests check `execute` against the same references."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.runtime.reshard.annotation import Box, box_size, local_box
from tidal.runtime.reshard.plan import Cell, CommPlan


def _sl(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def simulate(plan: CommPlan, inputs: dict[int, Sequence[np.ndarray | None]]) -> dict[int, list[np.ndarray | None]]:
    """`inputs[rank][t]`: that rank's source shard of tensor t. Returns `outputs[rank][t]` under the destinations."""
    src_box: dict[tuple[int, int], Box] = {}
    dst_box: dict[tuple[int, int], Box] = {}
    out: dict[int, list[np.ndarray | None]] = {}
    ranks = set(inputs)
    for t, mv in enumerate(plan.moves):
        for e in mv.src.entries(mv.shape):
            src_box[e.device, t] = e.box
            ranks.add(e.device)
        for e in mv.dst.entries(mv.shape):
            dst_box[e.device, t] = e.box
            ranks.add(e.device)
    dtype = next((x.dtype for xs in inputs.values() for x in xs if x is not None), np.float64)
    for r in ranks:
        out[r] = [None] * len(plan.moves)
        for t in range(len(plan.moves)):
            if (r, t) in dst_box:
                out[r][t] = np.zeros([b - a for a, b in dst_box[r, t]], dtype=dtype)
    reduced: dict[tuple[int, Cell], np.ndarray] = {}

    def read(r: int, cell: Cell) -> np.ndarray:
        if (r, cell) in reduced:
            return reduced[r, cell]
        t, box = cell
        return inputs[r][t][_sl(local_box(src_box[r, t], box))]

    def write(r: int, cell: Cell, data: np.ndarray) -> None:
        t, box = cell
        view = out[r][t][_sl(local_box(dst_box[r, t], box))]
        view[...] = data.reshape(view.shape)

    for red in plan.reductions:
        for box, root, ct in red.items:
            cell = (red.tensor, box)
            reduced[root, cell] = read(root, cell).copy() if root in ct else np.zeros([b - a for a, b in box], dtype)
    for m in plan.reduce_msgs:
        for c in m.cells:
            reduced[m.receiver, c] = reduced[m.receiver, c] + read(m.sender, c)
    for col in plan.collectives:
        contrib = dict(col.contrib)

        def part(r: int, c: Cell, contrib=contrib, kind=col.kind) -> np.ndarray:
            if kind != "AG" and r not in contrib[c]:
                return np.zeros([b - a for a, b in c[1]], dtype=dtype)
            return read(r, c)

        if col.kind == "AR":
            writers = dict(col.writers)
            for c in col.chunks[0]:
                total = sum(part(r, c) for r in col.ranks)
                for r in writers[c]:
                    write(r, c, total)
        elif col.kind == "RS":
            for i, r in enumerate(col.ranks):
                for c in col.chunks[i]:
                    write(r, c, sum(part(q, c) for q in col.ranks))
        else:
            for i, r in enumerate(col.ranks):
                for c in col.chunks[i]:
                    data = part(r, c)
                    for q in col.ranks:
                        write(q, c, data)
    for m in plan.messages:
        payload = [read(m.sender, c).copy() for c in m.cells]
        for c, data in zip(m.cells, payload):
            assert box_size(c[1]) == data.size
            write(m.receiver, c, data)
    for r, c in plan.copies:
        write(r, c, read(r, c))
    return out
