"""Annotation deduction (Hetu v2 §5.2) and Llama-layer annotations for a Strategy. Pure python.

Deduction works per device: an operator maps every device's input boxes (and partial coordinates) to its output box
and partial coordinate, then the output DS of each subgroup is recovered by `infer_states` (the split / partial /
duplicate degrees and the order that reproduce the device layout exactly). HDim follows the operator's rule. Inputs
must share the DG union (Hetu: only CommOps change it); anything needing communication raises TidalError.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, ParamInfo, param_table
from tidal.core.strategy import Strategy
from tidal.runtime.reshard.annotation import (
    DUPLICATE,
    PARTIAL,
    Annotation,
    Box,
    DistributedStates,
    subgroup_boxes,
)

Layout = list[list[tuple[Box, tuple]]]  # per subgroup, per device: (box, partial id)


def _layout(a: Annotation, shape: Sequence[int]) -> Layout:
    out: Layout = [[] for _ in a.groups]
    for e in a.entries(tuple(shape)):
        out[e.subgroup].append((e.box, (e.addend[1],)))
    return out


def _same_groups(*anns: Annotation) -> None:
    g0 = anns[0].groups
    for a in anns[1:]:
        if a.groups != g0:
            raise TidalError("operator inputs have different device-group unions; insert a comm op to align them")


def infer_states(layout: list[tuple[Box, tuple]], region: Box) -> DistributedStates:
    """The DS whose device layout over `region` equals `layout` (boxes and partial grouping), or TidalError."""
    n = len(layout)
    ndim = len(region)
    degrees: dict[int, int] = {}
    for d in range(ndim):
        k = len({b[d] for b, _ in layout})
        if k > 1:
            degrees[d] = k
    parts = len({p for _, p in layout})
    if parts > 1:
        degrees[PARTIAL] = parts
    rest, r = divmod(n, math.prod(degrees.values()))
    if r:
        raise TidalError(f"device layout of {n} devices is not a regular sharding")
    if rest > 1:
        degrees[DUPLICATE] = rest
    for order in itertools.permutations(sorted(degrees)):
        ds = DistributedStates.make(degrees, order)
        cand = subgroup_boxes(ds, region)
        if [b for b, _ in cand] != [b for b, _ in layout]:
            continue
        pairs = {(j, p) for (_, j), (_, p) in zip(cand, layout)}
        if len(pairs) == len({j for j, _ in pairs}) == len({p for _, p in pairs}):
            return ds
    raise TidalError(f"device layout of {n} devices is not expressible as distributed states")


def _build(a: Annotation, hdim: int, hweights, shape: Sequence[int], layout: Layout) -> Annotation:
    shape = tuple(shape)
    probe = Annotation(a.groups, tuple(DistributedStates() if len(g) == 1 else
                                       DistributedStates.make({DUPLICATE: len(g)}) for g in a.groups), hdim,
                       hweights if hdim >= 0 else None)
    states = tuple(infer_states(layout[g], probe.region(g, shape)) for g in range(a.hsize))
    return Annotation(a.groups, states, probe.hdim, probe.hweights)


def _top(hdims: Sequence[tuple[int, tuple | None]]) -> tuple[int, tuple | None]:
    """Combine per-input output HDims: DUP is neutral, anything else must agree."""
    real = {h for h in hdims if h[0] != DUPLICATE}
    if len(real) > 1:
        raise TidalError(f"inputs disagree on the heterogeneous dimension ({sorted(h[0] for h in real)})")
    return real.pop() if real else (DUPLICATE, None)


def linear(x: Annotation, w: Annotation, x_shape: Sequence[int], w_shape: Sequence[int]) -> tuple[Annotation, tuple]:
    """y = x @ w.T with x [..., k] and w [n, k] (torch Linear). Returns (annotation, shape)."""
    _same_groups(x, w)
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(w_shape) != 2 or x_shape[-1] != w_shape[1]:
        raise TidalError(f"linear: x {list(x_shape)} and weight {list(w_shape)} do not match")
    nd = len(x_shape)
    lx, lw = _layout(x, x_shape), _layout(w, w_shape)
    out: Layout = []
    for g in range(x.hsize):
        rows = []
        for (bx, px), (bw, pw) in zip(lx[g], lw[g]):
            if bx[-1] != bw[1]:
                raise TidalError("linear: x and weight shards do not agree on the contraction dimension; insert a "
                                 "comm op")
            if x.states[g].partial > 1 and w.states[g].partial > 1:
                raise TidalError("linear: both operands are partial")
            rows.append((bx[:-1] + (bw[0],), (px, pw, bx[-1])))
        out.append(rows)
    hx = x.hdim if x.hdim < nd - 1 else (PARTIAL if x.hdim in (nd - 1, PARTIAL) else DUPLICATE)
    hw = {DUPLICATE: DUPLICATE, 0: nd - 1, 1: PARTIAL, PARTIAL: PARTIAL}[w.hdim]
    hdim, weights = _top([(hx, x.hweights), (hw, w.hweights)])
    shape = x_shape[:-1] + (w_shape[0],)
    return _build(x, hdim, weights, shape, out), shape


def elementwise(xs: Sequence[Annotation], shapes: Sequence[Sequence[int]], op: str = "mul") -> tuple[Annotation,
                                                                                                      tuple]:
    """Broadcasting elementwise op. `op` is "add" (partial inputs must be identically partial) or "mul" / any other
    op (at most one partial input, which must be linear in it, e.g. scaling)."""
    _same_groups(*xs)
    shapes = [tuple(s) for s in shapes]
    nd = max(len(s) for s in shapes)
    out_shape = []
    for d in range(nd):
        sizes = {s[d - nd + len(s)] for s in shapes if d - nd + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise TidalError(f"elementwise: shapes {[list(s) for s in shapes]} do not broadcast")
        out_shape.append(sizes.pop() if sizes else 1)
    lays = [_layout(a, s) for a, s in zip(xs, shapes)]
    out: Layout = []
    for g in range(xs[0].hsize):
        rows = []
        for dev in range(len(xs[0].groups[g])):
            box, parts = [(0, n) for n in out_shape], []
            for a, s, lay in zip(xs, shapes, lays):
                b, p = lay[g][dev]
                for d in range(len(s)):
                    od = d + nd - len(s)
                    if s[d] == 1 and out_shape[od] != 1:
                        continue
                    if box[od] != (0, out_shape[od]) and box[od] != b[d]:
                        raise TidalError("elementwise: input shards do not line up; insert a comm op")
                    box[od] = b[d]
                parts.append(p if a.states[g].partial > 1 else None)
            real = [p for p in parts if p is not None]
            if op == "add" and real and len(real) != len(parts):
                raise TidalError("elementwise add of partial and non-partial inputs; reduce the partial one first")
            if op != "add" and len(real) > 1:
                raise TidalError(f"elementwise {op} of several partial inputs is not linear")
            rows.append((tuple(box), tuple(real[:1]) if op != "add" else tuple(real)))
        out.append(rows)
    hd = []
    for a, s in zip(xs, shapes):
        hd.append((a.hdim + nd - len(s) if a.hdim >= 0 else a.hdim, a.hweights))
    hdim, weights = _top(hd)
    return _build(xs[0], hdim, weights, out_shape, out), tuple(out_shape)


def reshape(x: Annotation, shape: Sequence[int], new_shape: Sequence[int]) -> tuple[Annotation, tuple]:
    """Reshape whose dims group as merges / splits of contiguous dims; each device's box must stay a box."""
    shape, new_shape = tuple(shape), tuple(new_shape)
    if math.prod(shape) != math.prod(new_shape):
        raise TidalError(f"reshape: {list(shape)} and {list(new_shape)} have different sizes")
    groups, i, j = [], 0, 0  # (old dims, new dims) with equal products
    while i < len(shape) or j < len(new_shape):
        oi, nj, po, pn = [i], [j], shape[i] if i < len(shape) else 1, new_shape[j] if j < len(new_shape) else 1
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn:
                po *= shape[i]
                oi.append(i)
                i += 1
            else:
                pn *= new_shape[j]
                nj.append(j)
                j += 1
        groups.append(([d for d in oi if d < len(shape)], [d for d in nj if d < len(new_shape)]))

    def map_box(box: Box) -> Box:
        out = [None] * len(new_shape)
        for od, ndims in groups:
            if not ndims:
                continue
            # flat range of the old group, valid only if inner old dims are whole
            lo, hi = 0, 1
            for k, d in enumerate(od):
                a, b = box[d]
                if k > 0 and (lo, hi) != (0, 1) and (a, b) != (0, shape[d]):
                    raise TidalError("reshape would make a shard non-contiguous; insert a comm op")
                lo, hi = lo * shape[d] + a, (hi - 1) * shape[d] + b
            inner = math.prod(new_shape[d] for d in ndims[1:])
            if len(ndims) > 1 and (lo % inner or hi % inner):
                raise TidalError("reshape splits a shard across a new dimension; insert a comm op")
            out[ndims[0]] = (lo // inner, hi // inner)
            for d in ndims[1:]:
                out[d] = (0, new_shape[d])
        return tuple(out)

    lay = _layout(x, shape)
    out = [[(map_box(b), p) for b, p in rows] for rows in lay]
    hdim = x.hdim
    if hdim >= 0:
        grp = next(g for g in groups if hdim in g[0])
        if grp[0][0] != hdim or not grp[1]:
            raise TidalError("reshape: the heterogeneous dimension must stay the outermost of its group")
        hdim = grp[1][0]
    return _build(x, hdim, x.hweights, new_shape, out), new_shape


def reduce_sum(x: Annotation, shape: Sequence[int], dim: int, keepdim: bool = False) -> tuple[Annotation, tuple]:
    """Sum over `dim`: a split `dim` turns into partial (and HDim `dim` into top-tier partial)."""
    shape = tuple(shape)
    dim = dim % len(shape)
    lay = _layout(x, shape)
    full = (0, shape[dim])
    out = []
    for rows in lay:
        new = []
        for b, p in rows:
            nb = b[:dim] + ((0, 1),) + b[dim + 1:] if keepdim else b[:dim] + b[dim + 1:]
            new.append((nb, p + ((b[dim],) if b[dim] != full else ())))
        out.append(new)
    new_shape = shape[:dim] + ((1,) if keepdim else ()) + shape[dim + 1:]
    hdim = x.hdim
    if hdim == dim:
        hdim = PARTIAL
    elif hdim > dim and not keepdim:
        hdim -= 1
    return _build(x, hdim, x.hweights if hdim >= 0 else None, new_shape, out), new_shape


def all_reduce_partial(x: Annotation) -> Annotation:
    """The CommOp after a row-parallel linear: bottom-tier partial becomes duplicate (same order position)."""
    states = []
    for ds in x.states:
        deg = dict(ds.states)
        if PARTIAL in deg and DUPLICATE in deg and abs(ds.order.index(PARTIAL) - ds.order.index(DUPLICATE)) != 1:
            raise TidalError(f"all-reduce of {ds}: partial and duplicate must be adjacent in the order")
        if PARTIAL in deg:
            deg[DUPLICATE] = deg.pop(PARTIAL) * deg.get(DUPLICATE, 1)
        order = [DUPLICATE if k == PARTIAL else k for k in ds.order]
        order = list(dict.fromkeys(order))
        states.append(DistributedStates.make(deg, order))
    return Annotation(x.groups, tuple(states), x.hdim, x.hweights)


# ----------------------------------------------------------------------------------------- Llama under a Strategy
# Parameter names, shapes and TP split dims come from one table, tidal.core.model.param_table, which is also what the
# runtime's modules are named by (a test checks both). Short keys name one layer's tensors in llama_layer_annotations.
LAYER_KEYS = {"wq": "attention.wq.weight", "wk": "attention.wk.weight", "wv": "attention.wv.weight",
              "wo": "attention.wo.weight", "w_gate": "feed_forward.w1.weight", "w_up": "feed_forward.w3.weight",
              "w_down": "feed_forward.w2.weight", "attn_norm": "attention_norm.weight", "mlp_norm": "ffn_norm.weight"}


def param_infos(model: ModelSpec) -> dict[str, ParamInfo]:
    return {p.name: p for p in param_table(model)}


def param_info(model: ModelSpec, name: str) -> ParamInfo:
    info = param_infos(model).get(name)
    if info is None:
        raise TidalError(f"model {model.name} has no parameter {name!r}")
    return info


def layer_param_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    """One decoder layer's parameter shapes by short key (see LAYER_KEYS)."""
    infos = param_infos(model)
    return {k: infos[f"layers.0.{v}"].shape for k, v in LAYER_KEYS.items()}


def model_param_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model by its runtime name, in named_parameters() order."""
    return {p.name: p.shape for p in param_table(model)}


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its devices (CP rank outer, TP rank inner), degrees, and the layers [first, stop) it owns.
    Stages of one pipeline may differ in TP (Hetu v2's C2 strategy); Strategy pipelines convert with `stages_of`."""

    devices: tuple[int, ...]
    tp: int
    cp: int
    first: int
    stop: int
    embed: bool = False
    head: bool = False

    def __post_init__(self) -> None:
        if self.tp * self.cp != len(self.devices) or self.tp < 1 or self.cp < 1:
            raise TidalError(f"stage on {list(self.devices)} cannot have tp={self.tp} cp={self.cp}")


StageLayout = tuple[tuple[Stage, ...], ...]


def stages_of(strategy: Strategy | StageLayout, model: ModelSpec) -> StageLayout:
    if not isinstance(strategy, Strategy):
        return strategy
    out = []
    for p in strategy.pipelines:
        bounds = [0, *itertools.accumulate(p.scheme.stage_layers(model.layers))]
        out.append(tuple(Stage(p.stage_devices(s), p.scheme.tp, p.scheme.cp, bounds[s], bounds[s + 1], s == 0,
                               s == p.scheme.pp - 1) for s in range(p.scheme.pp)))
    return tuple(out)


def owner_stage(stages: tuple[Stage, ...], info: ParamInfo) -> Stage:
    if info.owner == "embed":
        return next(s for s in stages if s.embed)
    if info.owner == "head":
        return next(s for s in stages if s.head)
    layer = int(info.owner)
    for s in stages:
        if s.first <= layer < s.stop:
            return s
    raise TidalError(f"no stage of the pipeline owns layer {layer}")


def holder_stages(stages: tuple[Stage, ...], info: ParamInfo) -> tuple[Stage, ...]:
    """The stages of one pipeline that hold a parameter: its owner, plus the last stage for a tied embedding (its
    output head) when that is another stage."""
    own = owner_stage(stages, info)
    if info.tied_head:
        last = next(s for s in stages if s.head)
        if last != own:
            if last.tp != own.tp:
                raise TidalError(f"tied embedding on stages of TP {own.tp} and {last.tp}: give them equal TP")
            return own, last
    return (own,)


def split_dim(model: ModelSpec, name: str) -> int | None:
    return param_info(model, name).tp_dim


def param_annotation(strategy: Strategy | StageLayout, model: ModelSpec, name: str, grad: bool = False,
                     info: ParamInfo | None = None) -> Annotation:
    """Parameter (or its gradient) under a strategy: in every pipeline, the stage owning it holds it split over TP
    (column / row / vocab parallel; norms duplicated over TP) and duplicated over CP; a tied embedding is held by the
    first and the last stage alike. Pipelines duplicate parameters (HDim DUP).

    Gradient contract (the runtime's ``run_pipeline(reduce_replicas=False)``): gradients are partial over the CP ranks,
    over the two stages of a tied embedding and over pipelines (HDim PARTIAL) until pushed; over TP a split weight's
    shards are disjoint and a norm's gradient is identical on every TP rank (duplicate)."""
    info = info if info is not None else param_info(model, name)
    split = info.tp_dim
    rep = PARTIAL if grad else DUPLICATE
    parts = []
    for stages in stages_of(strategy, model):
        held = holder_stages(stages, info)
        tp, reps = held[0].tp, sum(st.cp for st in held)
        devices = tuple(d for st in held for d in st.devices)
        if split is None:
            deg = {rep: reps, DUPLICATE: tp} if grad else {DUPLICATE: reps * tp}
            order = (rep, DUPLICATE) if grad else (DUPLICATE,)
        else:
            deg, order = {rep: reps, split: tp}, (rep, split)
        parts.append((devices, DistributedStates.make(deg, order)))
    return Annotation.union(parts, PARTIAL if grad else DUPLICATE)


def fully_sharded(devices: Sequence[int], shape: Sequence[int]) -> Annotation:
    """Hydraulis' optimisation-phase layout: every parameter split along dim 0 over all devices (no redundancy)."""
    del shape
    return Annotation.spmd(devices, {0: len(devices)})


def llama_layer_annotations(strategy: Strategy, model: ModelSpec, layer: int,
                            tokens: Sequence[int]) -> dict[str, tuple[Annotation, tuple]]:
    """Annotations and global shapes of one decoder layer's parameters, gradients and activations. Activations are
    [T, hidden] with T = sum(tokens): pipelines split T non-uniformly (HDim 0, weights = tokens per pipeline), CP
    splits a pipeline's tokens, TP duplicates them; TP-split activations follow from deduction."""
    if len(tokens) != len(strategy.pipelines) or min(tokens) < 1:
        raise TidalError(f"give a positive token count per pipeline ({len(strategy.pipelines)}), got {list(tokens)}")
    shapes = layer_param_shapes(model)
    out: dict[str, tuple[Annotation, tuple]] = {}
    for k, shp in shapes.items():
        name = f"layers.{layer}.{LAYER_KEYS[k]}"
        out[k] = (param_annotation(strategy, model, name), shp)
        out[k + ".grad"] = (param_annotation(strategy, model, name, grad=True), shp)
    t = sum(tokens)
    parts = []
    for p in strategy.pipelines:
        deg = {0: p.scheme.cp, DUPLICATE: p.scheme.tp}
        st = owner_stage(stages_of(Strategy((p,)), model)[0], param_info(model, f"layers.{layer}.{LAYER_KEYS['wq']}"))
        parts.append((st.devices, DistributedStates.make(deg, (0, DUPLICATE))))
    x = Annotation.union(parts, 0, tokens)
    act = {"x": (x, (t, model.hidden))}

    def op(name, value):
        act[name] = value
        return value

    def w(k):
        return out[k][0], out[k][1]

    def lin(a, k):
        return linear(a[0], out[k][0], a[1], out[k][1])

    h = model.hidden
    hn = op("attn_norm_out", elementwise([x, w("attn_norm")[0]], [(t, h), (h,)]))
    for k in ("q", "k", "v"):
        op(k, lin(hn, "w" + k))
    qh = op("q_heads", reshape(*act["q"], (t, model.heads, model.head_dim)))
    op("attn_out", reshape(qh[0], qh[1], (t, h)))  # attention keeps the q layout (heads over TP, tokens over CP)
    o = op("o_partial", lin(act["attn_out"], "wo"))
    o = op("o", (all_reduce_partial(o[0]), o[1]))
    r = op("resid1", elementwise([x, o[0]], [(t, h), o[1]], op="add"))
    sq = op("sumsq", reduce_sum(*elementwise([r[0], r[0]], [r[1], r[1]]), dim=-1, keepdim=True))
    del sq
    mn = op("mlp_norm_out", elementwise([r[0], w("mlp_norm")[0]], [r[1], (h,)]))
    g = op("gate", lin(mn, "w_gate"))
    u = op("up", lin(mn, "w_up"))
    a = op("act", elementwise([g[0], u[0]], [g[1], u[1]]))
    d = op("down_partial", lin(a, "w_down"))
    d = op("down", (all_reduce_partial(d[0]), d[1]))
    op("out", elementwise([r[0], d[0]], [r[1], d[1]], op="add"))
    out.update(act)
    return out
