"""Communication primitives with explicit process groups, autograd-aware where the algorithms need it.

Conventions: every function takes the group it talks over; ``group=None`` means *a group of one* (degree 1, no
communication at all), never the default world group. Nothing here holds state between calls. Point-to-point
traffic lives with its users: the pipeline's paired batches in runtime/pp.py, the resharding engine's in
runtime/reshard/execute.py, each on process groups of its own (runtime/groups.py).

Gloo notes: reduce-scatter is all-reduce then slice where the backend lacks it (gloo before PyTorch 2.8; see
`runtime.groups.native_reduce_scatter`); all-gather of unequal sizes pads each rank's rows to the group maximum
(padding is on the wire only, never computed on).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tidal.runtime.groups import native_reduce_scatter


def group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group) -> int:
    return 0 if group is None else dist.get_rank(group)


def all_reduce_(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce (no autograd); returns `t`."""
    if group_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def reduce_scatter_rows(t: torch.Tensor, group) -> torch.Tensor:
    """Sum `t` ([world * n, ...]) over the group and return this rank's rows [rank * n, (rank + 1) * n)."""
    w = group_size(group)
    if w == 1:
        return t
    n = t.shape[0] // w
    r = group_rank(group)
    if not native_reduce_scatter(dist.get_backend(group)):
        buf = t.contiguous().clone()
        dist.all_reduce(buf, group=group)
        return buf[r * n : (r + 1) * n].contiguous()
    out = torch.empty((n, *t.shape[1:]), dtype=t.dtype, device=t.device)
    # reduce_scatter_single replaces reduce_scatter_tensor (deprecated) in newer torch; same signature
    fn = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    fn(out, t.contiguous(), group=group)
    return out


def all_gather_rows(t: torch.Tensor, group, rows: int) -> torch.Tensor:
    """Gather `t` ([n_r, ...], n_r <= rows) from every rank into [world * rows, ...]; rank r's rows start at r*rows."""
    w = group_size(group)
    if t.shape[0] < rows:
        t = torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])
    if w == 1:
        return t
    out = [torch.empty_like(t) for _ in range(w)]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.cat(out)


class _CopyToGroup(torch.autograd.Function):
    """Identity forward, all-reduce backward (Megatron's "f")."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return all_reduce_(g.contiguous().clone(), ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    """All-reduce forward, identity backward (Megatron's "g")."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherRows(torch.autograd.Function):
    """All-gather rows (padded to `rows` per rank) forward; reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, rows):
        ctx.group, ctx.n = group, x.shape[0]
        return all_gather_rows(x, group, rows)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_rows(g, ctx.group)[: ctx.n], None, None


def copy_to_group(x: torch.Tensor, group) -> torch.Tensor:
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group) -> torch.Tensor:
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


def gather_rows(x: torch.Tensor, group, rows: int) -> torch.Tensor:
    """Autograd all-gather of variable row counts: [n_r, ...] -> [world * rows, ...] (rank-major, zero-padded)."""
    return _GatherRows.apply(x, group, rows)


def seq_rows(tokens: int, world: int) -> int:
    """Rows each rank holds of a `tokens`-row activation split along the sequence over `world` ranks (sequence
    parallelism): ceil(tokens / world), at least 1 so that every collective has a payload. The last rows are padding."""
    return max(1, -(-int(tokens) // int(world)))


def _layout_to_group(x: torch.Tensor, slots: tuple[int, ...], rows: int) -> torch.Tensor:
    """Reorder [world * rows] row blocks from layout order (block t = layout rank t) to group order (block g = group
    rank g); `slots[t]` is layout rank t's group rank."""
    if all(s == t for t, s in enumerate(slots)):
        return x
    inv = sorted(range(len(slots)), key=lambda t: slots[t])
    return torch.cat([x[t * rows : (t + 1) * rows] for t in inv])


def _group_to_layout(x: torch.Tensor, slots: tuple[int, ...], rows: int) -> torch.Tensor:
    if all(s == t for t, s in enumerate(slots)):
        return x
    return torch.cat([x[s * rows : (s + 1) * rows] for s in slots])


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def _seq_scatter(x: torch.Tensor, group, slots: tuple[int, ...]) -> torch.Tensor:
    w = group_size(group)
    rows = seq_rows(x.shape[0], w)
    return reduce_scatter_rows(_layout_to_group(_pad_rows(x, w * rows), slots, rows), group)


def _seq_gather(x: torch.Tensor, group, slots: tuple[int, ...], tokens: int) -> torch.Tensor:
    full = all_gather_rows(x, group, x.shape[0])
    return _group_to_layout(full, slots, x.shape[0])[:tokens]


class _ScatterToSequence(torch.autograd.Function):
    """Reduce-scatter along the sequence forward (partial sums in, this rank's summed rows out); all-gather backward
    (Megatron's sequence-parallel "g-bar")."""

    @staticmethod
    def forward(ctx, x, group, slots):
        ctx.group, ctx.slots, ctx.tokens = group, slots, x.shape[0]
        return _seq_scatter(x, group, slots)

    @staticmethod
    def backward(ctx, g):
        return _seq_gather(g.contiguous(), ctx.group, ctx.slots, ctx.tokens), None, None


class _GatherFromSequence(torch.autograd.Function):
    """All-gather along the sequence forward; reduce-scatter of the gradient backward (Megatron's "f-bar")."""

    @staticmethod
    def forward(ctx, x, group, slots, tokens):
        ctx.group, ctx.slots = group, slots
        return _seq_gather(x.contiguous(), group, slots, tokens)

    @staticmethod
    def backward(ctx, g):
        return _seq_scatter(g.contiguous(), ctx.group, ctx.slots), None, None, None


def scatter_to_sequence(x: torch.Tensor, group, slots: tuple[int, ...]) -> torch.Tensor:
    """Sum `x` ([tokens, ...], a partial sum on every rank) over the group and keep this rank's sequence shard:
    rows [t * r, (t + 1) * r) of the zero-padded sum, r = seq_rows(tokens, world), t = this rank's layout index."""
    return x if group_size(group) == 1 else _ScatterToSequence.apply(x, group, tuple(slots))


def gather_from_sequence(x: torch.Tensor, group, slots: tuple[int, ...], tokens: int) -> torch.Tensor:
    """Concatenate every rank's sequence shard (layout order) and drop the padding: [tokens, ...]."""
    return x if group_size(group) == 1 else _GatherFromSequence.apply(x, group, tuple(slots), int(tokens))
