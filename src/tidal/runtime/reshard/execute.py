"""Execute a CommPlan on torch.distributed (gloo on CPU, NCCL on GPU).

Every rank of the world calls `execute` with the same plan (ranks not involved return at once after the group cache is
brought up to date; `new_group` must be called by every rank in the same order), or each rank with its own part of it
(a per-rank plan of `local.py`, which has no collectives). Process groups live in an explicit
`GroupCache` created once by the caller and passed in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.distributed as dist

from tidal.core.errors import TidalError
from tidal.runtime.groups import GroupCache
from tidal.runtime.reshard.annotation import Box, box_size, local_box
from tidal.runtime.reshard.plan import Cell, CommPlan, RankView

__all__ = ["GroupCache", "InFlight", "check_inputs", "execute", "start"]


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def check_inputs(view: RankView, inputs: Sequence[torch.Tensor | None], dtype: torch.dtype, rank: int) -> None:
    """Every input this rank's part of a plan reads has its local shape and the plan's dtype (one TidalError line
    otherwise). One list comparison in the common case (`RankView.want`), the per-tensor walk only to name a fault."""
    if len(inputs) != len(view.want):
        raise TidalError(f"plan moves {len(view.want)} tensors but {len(inputs)} inputs were given")
    if [None if x is None else x.shape for x in inputs] == view.want and \
            all(x.dtype == dtype for x in inputs if x is not None):
        return
    for t, want in view.src_shape.items():
        x = inputs[t]
        if x is None or x.shape != want:
            got = None if x is None else list(x.shape)
            raise TidalError(f"rank {rank}: tensor {t} input should have local shape {list(want)}, got {got}")
        if x.dtype != dtype:
            raise TidalError(f"rank {rank}: tensor {t} has dtype {x.dtype}, plan executes in {dtype}")


class _Local:
    """One rank's view of a plan: its source and destination boxes, reduced cells and outputs."""

    def __init__(self, plan: CommPlan, rank: int, inputs: Sequence[torch.Tensor | None], dtype: torch.dtype,
                 device: torch.device | str = "cpu", checked: bool = False) -> None:
        # this rank's boxes: carried by a per-rank plan, derived once per world plan (never a scan per step)
        view = plan.rank_view(rank)
        if not checked:  # `checked`: the caller validated these inputs' shapes and dtype once (the executor does)
            check_inputs(view, inputs, dtype, rank)
        self.inputs = inputs
        self.out: list[torch.Tensor | None] = [None] * len(plan.moves)
        self.reduced: dict[Cell, torch.Tensor] = {}
        self.src_box: dict[int, Box] = view.src_box
        self.dst_box: dict[int, Box] = view.dst_box
        for t, shape in view.dst_shape.items():
            self.out[t] = torch.zeros(shape, dtype=dtype, device=device)
        self.dtype = dtype
        self.device = device

    def read(self, cell: Cell) -> torch.Tensor:
        if cell in self.reduced:
            return self.reduced[cell]
        t, box = cell
        return self.inputs[t][_slices(local_box(self.src_box[t], box))]

    def write(self, cell: Cell, data: torch.Tensor) -> None:
        t, box = cell
        view = self.out[t][_slices(local_box(self.dst_box[t], box))]
        view.copy_(data.reshape(view.shape))

    def pack(self, cells: Sequence[Cell], contrib: dict | None = None, me: int = -1) -> torch.Tensor:
        parts = []
        for c in cells:
            if contrib is not None and me not in contrib[c]:
                parts.append(torch.zeros(box_size(c[1]), dtype=self.dtype, device=self.device))
            else:
                parts.append(self.read(c).reshape(-1))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=self.dtype, device=self.device)

    def unpack(self, buf: torch.Tensor, cells: Sequence[Cell], add: bool = False, writers: dict | None = None,
               me: int = -1) -> None:
        off = 0
        for c in cells:
            n = box_size(c[1])
            piece = buf[off:off + n]
            off += n
            if writers is not None and me not in writers[c]:
                continue
            if add:
                self.reduced[c].add_(piece.reshape(self.reduced[c].shape))
            else:
                self.write(c, piece)


def _p2p(local: _Local, rank: int, msgs, add: bool, group) -> None:
    """One batch_isend_irecv per message batch this rank takes part in, on the engine's p2p group (no tags: messages
    between two ranks match in posting order, which is the plan's order on both)."""
    by_batch = defaultdict(list)
    for m in msgs:
        if rank in (m.sender, m.receiver):
            by_batch[m.batch].append(m)
    for batch in sorted(by_batch):
        ops, recvs = [], []
        for m in by_batch[batch]:
            if m.sender == rank:
                ops.append(dist.P2POp(dist.isend, local.pack(m.cells).contiguous(), m.receiver, group=group))
            else:
                buf = torch.empty(m.elems, dtype=local.dtype, device=local.device)
                ops.append(dist.P2POp(dist.irecv, buf, m.sender, group=group))
                recvs.append((buf, m))
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        for buf, m in recvs:
            local.unpack(buf, m.cells, add=add)


def execute(plan: CommPlan, inputs: Sequence[torch.Tensor | None], groups: GroupCache,
            dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> list[torch.Tensor | None]:
    """Run `plan` on this rank. `inputs[t]` is this rank's local shard of tensor t under its source annotation (None
    where the rank holds none). Returns the local shards under the destination annotations (None where none).
    `device`: where buffers live (default: the inputs' device, else CPU; pass the rank's GPU with NCCL)."""
    rank = dist.get_rank()
    groups.ensure(plan.group_ranks())
    if device is None:
        device = next((x.device for x in inputs if x is not None), torch.device("cpu"))
    local = _Local(plan, rank, inputs, dtype, device)
    # Phase 1: point-to-point reductions at roots.
    for red in plan.reductions:
        for box, root, ct in red.items:
            if root == rank:
                cell = (red.tensor, box)
                local.reduced[cell] = (local.read(cell).clone() if rank in ct else
                                       torch.zeros([b - a for a, b in box], dtype=dtype, device=device))
    p2p = groups.p2p_group()
    _p2p(local, rank, plan.reduce_msgs, add=True, group=p2p)
    # Phase 2: collectives in plan order.
    for col in plan.collectives:
        if rank not in col.ranks:
            continue
        group = groups.get(col.ranks)
        me = col.ranks.index(rank)
        contrib = dict(col.contrib)
        if col.kind == "AR":
            buf = local.pack(col.chunks[0], contrib, rank)
            dist.all_reduce(buf, group=group)
            local.unpack(buf, col.chunks[0], writers=dict(col.writers), me=rank)
        elif col.kind == "RS":
            n = col.chunk_elems()
            full = torch.cat([local.pack(ch, contrib, rank) for ch in col.chunks])
            out = torch.empty(n, dtype=dtype, device=device)
            if groups.use_native_reduce_scatter(group):
                dist.reduce_scatter(out, list(full.split(n)), group=group)
            else:  # the backend lacks reduce-scatter (capability table in runtime.groups)
                dist.all_reduce(full, group=group)
                out = full[me * n:(me + 1) * n]
            local.unpack(out, col.chunks[me])
        else:  # AG
            mine = local.pack(col.chunks[me])
            bufs = [torch.empty(col.chunk_elems(), dtype=dtype, device=device) for _ in col.ranks]
            dist.all_gather(bufs, mine, group=group)
            for buf, ch in zip(bufs, col.chunks):
                local.unpack(buf, ch)
    # Phase 3: SR/BSR messages, then local copies.
    _p2p(local, rank, plan.messages, add=False, group=p2p)
    for r, cell in plan.copies:
        if r == rank:
            local.write(cell, local.read(cell))
    return local.out


class InFlight:
    """A plan whose point-to-point messages have been posted (one `batch_isend_irecv`): :meth:`poll` says without
    blocking whether they completed, :meth:`wait` completes them and returns the outputs. The inputs are no longer
    referenced once posted (sends are packed, a root's own addend is copied, copies from inputs are done), so the
    caller may free them at once."""

    def __init__(self, local: _Local, works: list, recvs: list, copies: list) -> None:
        self._local, self._works, self._recvs, self._copies = local, works, recvs, copies
        self._out: list[torch.Tensor | None] | None = None

    @property
    def done(self) -> bool:
        return self._out is not None

    def poll(self) -> bool:
        """True when every posted operation has completed (no wait, no host sync: a query of each work handle)."""
        return self._out is not None or all(w.is_completed() for w in self._works)

    def wait(self) -> list[torch.Tensor | None]:
        if self._out is None:
            for w in self._works:
                w.wait()
            self._finish()
        return self._out

    def finish_polled(self) -> list[torch.Tensor | None]:
        """The outputs of a plan :meth:`poll` found complete, without calling ``wait`` on its handles (a wait after
        completion would add nothing, and a wait recorded at a point the rank never blocks would mislead the order
        checker)."""
        if self._out is None:
            if not self.poll():
                raise TidalError("finish_polled() on a plan whose operations have not completed")
            self._finish()
        return self._out

    def _finish(self) -> None:
        local = self._local
        for buf, cells, add in self._recvs:  # plan order: a root sums its addends in the same order as execute()
            local.unpack(buf, cells, add=add)
        for cell in self._copies:
            local.write(cell, local.read(cell))
        self._out = local.out
        self._works, self._recvs, self._copies, self._local = [], [], [], None


def start(plan: CommPlan, inputs: Sequence[torch.Tensor | None], groups: GroupCache,
          dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
          checked: bool = False) -> InFlight:
    """Post this rank's messages of a plan made of point-to-point messages, root reductions and local copies (a pull
    or a push of `local.py`) in ONE `batch_isend_irecv`, without waiting, so the caller can compute while they travel.
    They travel on the engine's p2p group (`groups.p2p_group()`), a communicator of their own, so they never mix with
    the pipeline's activations or any collective whatever their timing. Every rank must start the same plans in the
    same order (messages between two ranks match in posting order). Plans with collectives, or whose messages send a
    cell this rank reduces (a world plan's phase 3 after its phase 1), are refused (use `execute`). `checked`: the
    caller has validated the inputs' shapes and dtype for this plan once (see `check_inputs`)."""
    if plan.collectives:
        raise TidalError("start() takes plans of point-to-point messages, reductions and copies only; use execute()")
    rank = dist.get_rank()
    group = groups.p2p_group()
    if device is None:
        device = next((x.device for x in inputs if x is not None), torch.device("cpu"))
    local = _Local(plan, rank, inputs, dtype, device, checked=checked)
    for red in plan.reductions:  # roots start from their own addend (a copy) or zeros, as in execute()
        for box, root, ct in red.items:
            if root == rank:
                cell = (red.tensor, box)
                local.reduced[cell] = (local.read(cell).clone() if rank in ct else
                                       torch.zeros([b - a for a, b in box], dtype=dtype, device=device))
    ops, recvs = [], []
    for add, msgs in ((True, plan.reduce_msgs), (False, plan.messages)):
        for m in sorted((m for m in msgs if rank in (m.sender, m.receiver)), key=lambda m: m.batch):
            if m.sender == rank:
                if not add and local.reduced and any(c in local.reduced for c in m.cells):
                    raise TidalError("start() cannot send a cell before its reduction completes; use execute()")
                ops.append(dist.P2POp(dist.isend, local.pack(m.cells).contiguous(), m.receiver, group=group))
            else:
                buf = torch.empty(m.elems, dtype=dtype, device=device)
                ops.append(dist.P2POp(dist.irecv, buf, m.sender, group=group))
                recvs.append((buf, m.cells, add))
    later = []
    for r, cell in plan.copies:  # copies from the inputs now (then the inputs can go); from reduced cells at the end
        if r == rank:
            if cell in local.reduced:
                later.append(cell)
            else:
                local.write(cell, local.read(cell))
    local.inputs = ()
    works = dist.batch_isend_irecv(ops) if ops else []
    return InFlight(local, list(works), recvs, later)
