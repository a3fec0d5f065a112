"""Pure tests of the Llama/Strategy annotations, operator deduction (numerically, shard by shard, against numpy on the
global tensors), Hydraulis' pull/push bound (App. B.1) and the switch plan cache. Integer-valued float64: exact."""

import numpy as np
import pytest

from tidal.core import TidalError, get_cluster, get_model, parse_strategy, place
from tidal.runtime.reshard import PARTIAL, Annotation, DistributedStates, Topology
from tidal.runtime.reshard.deduce import (
    Stage,
    elementwise,
    linear,
    llama_layer_annotations,
    model_param_shapes,
    reduce_sum,
    reshape,
)
from tidal.runtime.reshard.simulate import simulate
from tidal.runtime.reshard.switch import SwitchPlanner, pull_moves, push_moves
from tidal.runtime.reshard.testing import check, make_global, shard

pytestmark = pytest.mark.unit

STRATEGIES = ["tp2pp2+2*tp1pp2", "tp2+tp1+tp1", "2*tp2cp2", "tp2cp2+tp2pp2", "8*tp1", "tp2+6*tp1", "2*tp2pp2",
              "pp4+2*tp2", "4*cp2"]


def _strategy(text, world=8):
    return place(parse_strategy(text), get_cluster(f"cpux{world}"), get_model("tiny"))


@pytest.mark.parametrize("text", STRATEGIES)
def test_llama_layer_deduction_matches_numpy(text):
    """Compute the layer's linear / elementwise / reshape / sum ops shard by shard and check every output shard (and
    partial sums) against the same op on the global tensors, under the deduced annotation."""
    model = get_model("tiny")
    st = _strategy(text, 8 if text != "tp2+tp1+tp1" else 4)
    tokens = [7 + 3 * i for i in range(len(st.pipelines))]
    ann = llama_layer_annotations(st, model, layer=1, tokens=tokens)
    rng = np.random.default_rng(0)
    glob = {k: make_global(rng, s) for k, (a, s) in ann.items() if not k.endswith(".grad")}
    x_ann, x_shape = ann["x"]
    xs = shard(x_ann, glob["x"], rng)
    ws = {k: shard(ann[k][0], glob[k], rng) for k in ("wq", "wo", "w_gate", "attn_norm")}
    # q = (x * attn_norm) @ wq.T ; o = q @ wo.T (partial over TP) ; g = o_reduced @ w_gate.T ; s = sum(g, -1)
    hn = {d: xs[d] * ws["attn_norm"][d] for d in xs}
    q = {d: hn[d] @ ws["wq"][d].T for d in xs}
    assert check(ann["q"][0], (glob["x"] * glob["attn_norm"]) @ glob["wq"].T, q) is None
    qh = {d: v.reshape(v.shape[0], -1, model.head_dim) for d, v in q.items()}
    gq = (glob["x"] * glob["attn_norm"]) @ glob["wq"].T
    assert check(ann["q_heads"][0], gq.reshape(gq.shape[0], model.heads, model.head_dim), qh) is None
    o = {d: q[d] @ ws["wo"][d].T for d in xs}
    assert check(ann["o_partial"][0], gq @ glob["wo"].T, o) is None
    ga, gs = linear(ann["o"][0], ann["w_gate"][0], ann["o"][1], ann["w_gate"][1])
    vo = shard(ann["o"][0], gq @ glob["wo"].T, rng)
    g = {d: vo[d] @ ws["w_gate"][d].T for d in xs}
    assert check(ga, gq @ glob["wo"].T @ glob["w_gate"].T, g) is None
    sa, _ = reduce_sum(ga, gs, dim=-1)
    assert check(sa, (gq @ glob["wo"].T @ glob["w_gate"].T).sum(-1), {d: v.sum(-1) for d, v in g.items()}) is None


def test_deduction_rules_and_errors():
    ds = DistributedStates.make
    x = Annotation.spmd(range(4), {0: 2, 1: 2}, order=(0, 1))
    w = Annotation.spmd(range(4), {-1: 2, 1: 2}, order=(-1, 1))  # row-parallel weight [n, k]
    y, shape = linear(x, w, (6, 8), (5, 8))
    assert shape == (6, 5) and y.states[0] == ds({0: 2, PARTIAL: 2}, order=(0, PARTIAL))
    r, rshape = reshape(Annotation.spmd(range(2), {1: 2}), (4, 8), (4, 2, 4))
    assert rshape == (4, 2, 4) and r.states[0] == ds({1: 2})
    s, _ = reduce_sum(Annotation.union([([0], ds()), ([1], ds())], hdim=1), (3, 4), dim=1)
    assert s.hdim == PARTIAL
    with pytest.raises(TidalError):  # contraction shards disagree
        linear(Annotation.spmd(range(2), {1: 2}), Annotation.spmd(range(2), {0: 2}), (4, 8), (8, 8))
    with pytest.raises(TidalError):  # different device groups need a comm op
        elementwise([Annotation.spmd([0, 1], {0: 2}), Annotation.spmd([2, 3], {0: 2})], [(4,), (4,)])
    with pytest.raises(TidalError):  # reshape making a shard non-contiguous
        reshape(Annotation.spmd(range(2), {1: 2}), (4, 8), (32,))
    with pytest.raises(TidalError):  # product of two partials
        elementwise([Annotation.spmd(range(2), {PARTIAL: 2})] * 2, [(4,), (4,)], op="mul")


@pytest.mark.parametrize("text", STRATEGIES)
def test_pull_push_correct_and_bounded_by_parameter_size(text):
    """Hydraulis App. B.1: in pull and push every rank sends and receives at most W bytes per parameter of size W.
    Each parameter is planned alone (the bound is per parameter) and executed by the simulator."""
    model = get_model("tiny")
    world = 4 if text == "tp2+tp1+tp1" else 8
    st = _strategy(text, world)
    topo = Topology.from_cluster(get_cluster(f"cpux{world}"))
    planner = SwitchPlanner(topo, itemsize=8)
    rng = np.random.default_rng(1)
    shapes = model_param_shapes(model)
    for name in ("layers.1.attention.wq.weight", "layers.1.attention.wo.weight", "layers.3.feed_forward.w2.weight",
                 "layers.0.attention_norm.weight", "tok_embeddings.weight", "output.weight"):
        value = make_global(rng, shapes[name])
        w = value.size * 8
        for moves in (pull_moves(model, st, range(world), [name]), push_moves(model, st, range(world), [name])):
            plan = planner.plan(moves)
            assert plan.max_send() <= w and plan.max_recv() <= w, (name, plan.summary())
            out = simulate(plan, {r: [x] for r, x in shard(moves[0].src, value, rng).items()})
            assert check(moves[0].dst, value, {r: o[0] for r, o in out.items() if o[0] is not None}) is None
    if text == "8*tp1":  # the worst case of App. B.1 is tight: every rank needs everything
        plan = planner.plan(pull_moves(model, st, range(world), ["layers.1.attention.wq.weight"]))
        w = np.prod(shapes["layers.1.attention.wq.weight"]) * 8
        assert plan.max_recv() == w * 7 // 8 and plan.max_send() == w * 7 // 8


def test_switch_cache_fusion_and_heuristics():
    model = get_model("small")
    cluster = get_cluster("h20x16")
    a = place(parse_strategy("2*tp4pp2"), cluster, model)
    b = place(parse_strategy("tp4pp2+tp4+2*tp2"), cluster, model)
    planner = SwitchPlanner(Topology.from_cluster(cluster))
    fused = planner.switch(model, a, b)
    assert planner.switch(model, a, b) is fused and planner.misses == 1 and planner.hits == 1
    unfused = planner.switch(model, a, b, fused=False)
    naive = planner.switch(model, a, b, heuristics=False)
    pairs = {(m.sender, m.receiver) for m in fused.messages}
    assert len(fused.messages) == len(pairs) < len(unfused.messages)
    assert fused.total_bytes() == unfused.total_bytes() == naive.total_bytes()
    assert fused.inter_node_bytes() <= naive.inter_node_bytes()
    assert fused.max_send() <= unfused.max_send()


def test_stage_layout_with_per_stage_tp():
    """Hetu v2's C2 shape: a pipeline whose stages have TP 4, 2 and 1."""
    model = get_model("small")
    c2 = ((Stage((0, 1, 2, 3), 4, 1, 0, 4, embed=True), Stage((4, 5, 6, 7), 4, 1, 4, 8, head=True)),
          (Stage((8, 9, 10, 11), 4, 1, 0, 5, embed=True), Stage((12, 13), 2, 1, 5, 7), Stage((14,), 1, 1, 7, 8,
                                                                                             head=True)))
    planner = SwitchPlanner(Topology.uniform(16, 8))
    c1 = place(parse_strategy("2*tp4pp2"), get_cluster("h20x16"), model)
    plan = planner.switch(model, c1, c2)
    rng = np.random.default_rng(3)
    shapes = model_param_shapes(model)
    names = list(shapes)
    inputs: dict[int, list] = {}
    values = [make_global(rng, shapes[n]) for n in names]
    for t, (mv, v) in enumerate(zip(plan.moves, values)):
        for r, x in shard(mv.src, v, rng).items():
            inputs.setdefault(r, [None] * len(names))[t] = x
    out = simulate(plan, inputs)
    for t, (mv, v) in enumerate(zip(plan.moves, values)):
        assert check(mv.dst, v, {r: o[t] for r, o in out.items() if o[t] is not None}) is None
    with pytest.raises(TidalError):
        Stage((0, 1, 2), 2, 1, 0, 1)


def test_plan_cache_is_bounded():
    model = get_model("tiny")
    a, b = _strategy("2*tp2pp2"), _strategy("tp2+6*tp1")
    planner = SwitchPlanner(Topology.uniform(8), max_plans=1)
    first = planner.switch(model, a, b)
    planner.switch(model, b, a)
    again = planner.switch(model, a, b)
    assert planner.misses == 3 and again is not first and again.summary() == first.summary()
