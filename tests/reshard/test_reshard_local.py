"""Per-rank LNK planning (runtime/reshard/local.py) against the global planner (SwitchPlanner.pull/push).

Differential: for many strategies (TP/PP/CP mixes, heterogeneous pipelines, uneven layer splits, tied embeddings,
per-stage TP, world sizes 1-16), the union of every rank's local plan covers exactly the elements the global plan
moves, pair by pair and tensor by tensor; the push's reductions (root, cells, contributors) are identical; and every
rank's bytes equal the global planner's. On gloo ranks the local plans execute to exact results (integers in
float64: tolerance zero).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal.core import get_cluster, get_model, parse_strategy, place
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Pipeline, Strategy
from tidal.runtime.reshard import Topology
from tidal.runtime.reshard.deduce import Stage
from tidal.runtime.reshard.local import Links, LocalPlanner, owner_range
from tidal.runtime.reshard.switch import SwitchPlanner, pull_moves, push_moves

pytestmark = pytest.mark.reshard

TINY = get_model("tiny")
TIED = get_model("tiny-tied")
# rows >= 16 for every parameter (kv 32, hidden 64), 5 layers so splits are uneven
ODD = ModelSpec("odd", layers=5, hidden=48, heads=4, kv_heads=2, ffn=80, vocab=96, tie_embeddings=True)
WIDE = ModelSpec("wide", layers=4, hidden=64, heads=8, kv_heads=8, ffn=96, vocab=128)  # TP 8 divides it
MODELS = {"tiny": TINY, "tiny-tied": TIED, "odd": ODD, "wide": WIDE}


def _refine(a, b):
    """Elementary cells of two box lists over their common grid (to compare coverage, not box lists)."""
    boxes = list(a) + list(b)
    if not boxes:
        return set(), set()
    nd = len(boxes[0])
    cuts = [sorted({x for bx in boxes for x in bx[d]}) for d in range(nd)]

    def cells(bs):
        out = set()
        for bx in bs:
            rng = [[(c0, c1) for c0, c1 in zip(cuts[d], cuts[d][1:]) if bx[d][0] <= c0 and c1 <= bx[d][1]]
                   for d in range(nd)]
            for c in itertools.product(*rng):
                assert c not in out, "a message lists an element twice"
                out.add(c)
        return out

    return cells(a), cells(b)


def _coverage(msgs, by_sender=True):
    """(sender, receiver, tensor) -> boxes of every message."""
    out: dict = {}
    for m in msgs:
        for t, boxes in m.parts:
            out.setdefault((m.sender if by_sender else None, m.receiver, t), []).extend(boxes)
    return out


def _same_coverage(glob, loc, what):
    assert set(glob) == set(loc), f"{what}: pairs differ: {sorted(set(glob) ^ set(loc))[:5]}"
    for k in glob:
        a, b = _refine(glob[k], loc[k])
        assert a == b, f"{what}: {k} covers different elements"


def _pair(m):
    return m.sender, m.receiver


def _copies(copies):
    out: dict = {}
    for r, (t, box) in copies:
        out.setdefault((r, t), []).append(box)
    return out


def _single_norm(model, layout, world):
    """Whether some norm has one addend on TP duplicates (the one place where the sender is a local choice)."""
    planner = LocalPlanner(model, layout, world, 0, Links.from_topology(Topology.uniform(world)))
    return any(info.tp_dim is None and sum(h.reps for h in planner.holders(info)) == 1
               and planner.holders(info)[0].tp > 1 for info in param_table(model))


def compare(model, layout, world, per_node=4):
    """Every rank's local pull, per-group pulls and pushes, and push against the global planner's plans."""
    topo = Topology.uniform(world, per_node)
    links = Links.from_topology(topo)
    gp = SwitchPlanner(topo, itemsize=2).pull(model, layout, range(world))
    gq = SwitchPlanner(topo, itemsize=4).push(model, layout, range(world))
    table = param_table(model)
    groups = [[0], list(range(1, 10)), list(range(len(table) - 2, len(table)))]
    gg = [SwitchPlanner(topo, itemsize=2).plan(pull_moves(model, layout, range(world), [table[i].name for i in g]),
                                                bsr_only=True) for g in groups]
    hh = [SwitchPlanner(topo, itemsize=4).plan(push_moves(model, layout, range(world), [table[i].name for i in g]),
                                                bsr_only=True) for g in groups]
    planners = [LocalPlanner(model, layout, world, r, links) for r in range(world)]
    pulls = [p.pull(itemsize=2) for p in planners]
    pushes = [p.push(itemsize=4) for p in planners]
    single = _single_norm(model, layout, world)
    for glob, loc, what in [(gp, pulls, "pull"), (gq, pushes, "push")] + [
            (g, [p.pull(idx, itemsize=2) for p in planners], f"pull group {idx[:2]}") for g, idx in zip(gg, groups)] + [
            (h, [p.push(idx, itemsize=4) for p in planners], f"push group {idx[:2]}") for h, idx in zip(hh, groups)]:
        assert all(lp.moves == glob.moves for lp in loc), f"{what}: moves differ"
        for r, lp in enumerate(loc):  # every message of a local plan is its own, and each appears on both ends
            assert all(r in (m.sender, m.receiver) for m in lp.messages + lp.reduce_msgs)
            assert not lp.collectives and lp.group_ranks() == [] == glob.group_ranks()
            assert lp.rank_boxes(r) == glob.rank_boxes(r)
        sent = sorted((m for lp in loc for m in lp.messages if m.sender == lp.rank), key=_pair)
        got = sorted((m for lp in loc for m in lp.messages if m.receiver == lp.rank), key=_pair)
        assert sent == got, f"{what}: sender and receiver disagree on a message"
        _same_coverage(_coverage(glob.messages, not single), _coverage(got, not single), what)
        _same_coverage(_copies(glob.copies), _copies([c for lp in loc for c in lp.copies]), what + " copies")
        rsent = sorted((m for lp in loc for m in lp.reduce_msgs if m.sender == lp.rank), key=_pair)
        rgot = sorted((m for lp in loc for m in lp.reduce_msgs if m.receiver == lp.rank), key=_pair)
        assert rsent == rgot, f"{what}: sender and receiver disagree on a reduce message"
        assert sorted(glob.reduce_msgs, key=_pair) == rgot, f"{what}: reduce messages differ"
        greds = {(red.tensor, it) for red in glob.reductions for it in red.items}
        lreds = {(red.tensor, it) for lp in loc for red in lp.reductions for it in red.items}
        assert greds == lreds, f"{what}: reductions differ"
        for r, lp in enumerate(loc):
            g, s = glob.stats.get(r), lp.stats[r]
            if single:  # a norm's sender may differ: same totals
                continue
            assert (g.send_intra, g.send_inter, g.recv_intra, g.recv_inter) == (
                s.send_intra, s.send_inter, s.recv_intra, s.recv_inter) if g else s.send + s.recv == 0, \
                f"{what}: rank {r} bytes {s} != {g}"
        if single:
            assert sum(lp.stats[lp.rank].send for lp in loc) == sum(x.send for x in glob.stats.values())
            assert sum(lp.stats[lp.rank].recv for lp in loc) == sum(x.recv for x in glob.stats.values())


CASES = [
    ("tiny", "tp2pp2+2*tp1pp2", 8), ("tiny", "tp2cp2+2*tp2", 8), ("tiny", "tp4pp2", 8), ("tiny", "8*tp1", 8),
    ("tiny", "tp4+2*tp2", 8), ("tiny-tied", "tp2pp2+2*tp1pp2", 8), ("tiny-tied", "tp2pp3cp2", 12),
    ("tiny-tied", "pp2cp2+tp2pp2+tp4", 12), ("tiny", "tp1", 1), ("tiny", "tp2", 2), ("tiny-tied", "pp2", 2),
    ("tiny", "tp4pp2cp2", 16), ("tiny-tied", "tp2pp4+tp2pp2+pp2cp2", 16), ("wide", "tp8+tp4+tp2+2*tp1", 16),
]


@pytest.mark.parametrize("name,text,world", CASES)
def test_local_plans_equal_the_global_plan(name, text, world):
    model = MODELS[name]
    layout = place(parse_strategy(text), get_cluster(f"cpux{world}"), model)
    compare(model, layout, world)


def test_uneven_layer_splits_and_per_stage_tp():
    """Uneven splits (explicit layer_split), non-ascending device order, and a Hetu-C2 layout whose stages differ
    in TP, on a model whose sizes do not divide evenly."""
    sch = ParallelScheme(tp=2, pp=3, cp=1, layer_split=(1, 3, 1))
    pipes = (Pipeline(sch, (5, 4, 0, 1, 3, 2)), Pipeline(ParallelScheme(1, 2, 1, (4, 1)), (7, 6)))
    compare(ODD, Strategy(pipes), 8, per_node=4)
    n = TINY.layers
    c2 = ((Stage((0, 1, 2, 3), 4, 1, 0, n // 2, embed=True), Stage((4, 5, 6, 7), 4, 1, n // 2, n, head=True)),
          (Stage((8, 9, 10, 11), 4, 1, 0, 2, embed=True), Stage((12, 13), 2, 1, 2, 5), Stage((14,), 1, 1, 5, n,
                                                                                              head=True)))
    compare(TINY, c2, 15, per_node=8)


@st.composite
def strategies(draw):
    world = draw(st.integers(1, 12))
    model = draw(st.sampled_from([TINY, TIED, ODD]))
    devices = draw(st.permutations(range(world)))
    pipes, i = [], 0
    while i < world:
        left = world - i
        tp = draw(st.sampled_from([x for x in (1, 2, 4) if x <= left and model.kv_heads % x == 0]))
        cp = draw(st.sampled_from([x for x in (1, 2) if tp * x <= left]))
        pp = draw(st.integers(1, min(model.layers, left // (tp * cp))))
        split = None
        if pp > 1 and draw(st.booleans()):
            cuts = sorted(draw(st.sets(st.integers(1, model.layers - 1), min_size=pp - 1, max_size=pp - 1)))
            split = tuple(b - a for a, b in zip([0] + cuts, cuts + [model.layers]))
        k = tp * cp * pp
        pipes.append(Pipeline(ParallelScheme(tp, pp, cp, split), tuple(devices[i:i + k])))
        i += k
    per_node = draw(st.sampled_from([2, 4, 8]))
    return model, Strategy(tuple(pipes)), world, per_node


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies())
def test_random_strategies_equal_the_global_plan(case):
    model, strategy, world, per_node = case
    compare(model, strategy, world, per_node)


def test_owner_range_inverts_the_split():
    for rows, parts in [(10, 3), (3, 8), (64, 16), (97, 7), (1, 1)]:
        for lo in range(rows):
            for hi in range(lo + 1, rows + 1):
                want = [i for i in range(parts) if max(lo, (r := _rng(rows, parts, i))[0]) < min(hi, r[1])]
                assert list(owner_range(lo, hi, rows, parts)) == want, (rows, parts, lo, hi)


def _rng(rows, parts, i):
    from tidal.runtime.reshard.annotation import split_range

    return split_range(0, rows, parts, i)


def test_bad_input_is_refused():
    links = Links.from_topology(Topology.uniform(4))
    st4 = place(parse_strategy("2*tp2"), get_cluster("cpux4"), TINY)
    with pytest.raises(TidalError, match="outside the world"):
        LocalPlanner(TINY, st4, 4, 4, links)
    with pytest.raises(TidalError, match="distinct ranks"):
        LocalPlanner(TINY, st4, 3, 0, Links.from_topology(Topology.uniform(3)))
    plan = LocalPlanner(TINY, st4, 4, 1, links).pull()
    with pytest.raises(TidalError, match="made for rank 1"):
        plan.rank_boxes(2)


def test_links_match_the_topology():
    cluster = get_cluster("a800x16")
    topo, links = Topology.from_cluster(cluster), Links.from_cluster(cluster)
    assert links.nodes == topo.nodes
    assert all(links.bw(a, b) == topo.bw[a][b] for a in range(16) for b in range(16))
    assert np.isinf(links.bw(3, 3))


def _exec_worker(rank, world, cases):
    """Every rank plans only its own pull, per-layer pulls and pushes, executes them (execute; start for the
    per-group pulls and pushes, all posted before any is waited) and checks the gathered result against the
    reference layout exactly."""
    import torch
    import torch.distributed as dist

    from tidal.runtime.exec_util import _param_groups
    from tidal.runtime.reshard.execute import GroupCache, execute, start
    from tidal.runtime.reshard.testing import check, shard

    groups = GroupCache()
    failures = []

    def gather_check(anns, values, locals_, what):
        """One all_gather_object per plan; every tensor checked exactly."""
        outs = [None] * world
        dist.all_gather_object(outs, [None if x is None else x.numpy() for x in locals_])
        for t, (ann, value) in enumerate(zip(anns, values)):
            err = check(ann, value, {r: o[t] for r, o in enumerate(outs) if o[t] is not None})
            if err:
                failures.append(f"{what}: tensor {t}: {err}")

    for name, text, per_node in cases:
        model = MODELS[name]
        layout = place(parse_strategy(text), get_cluster(f"cpux{world}"), model)
        planner = LocalPlanner(model, layout, world, rank, Links.from_topology(Topology.uniform(world, per_node)))
        table = param_table(model)
        rng = np.random.default_rng(3)
        values = [rng.integers(-50, 51, size=info.shape).astype(np.float64) for info in table]
        pull, push = planner.pull(itemsize=8), planner.push(itemsize=8)
        for plan, what in ((pull, "pull"), (push, "push")):
            shards = [shard(mv.src, v, rng) for mv, v in zip(plan.moves, values)]
            xs = [torch.from_numpy(sh[rank]) if rank in sh else None for sh in shards]
            outs = execute(plan, xs, groups, dtype=torch.float64)
            gather_check([mv.dst for mv in plan.moves], values, outs, f"{text} {what}")
        index, _ = _param_groups(table)
        flights = []
        for idx in index:  # every layer group posted at once, completed in order (the executor's overlapped pull)
            plan = planner.pull(idx, itemsize=8)
            xs = [torch.from_numpy(shard(mv.src, values[i], rng)[rank]) for mv, i in zip(plan.moves, idx)]
            flights.append((idx, plan, start(plan, xs, groups, dtype=torch.float64)))
        outs = [o for _, _, fl in flights for o in fl.wait()]
        gather_check([mv.dst for _, plan, _ in flights for mv in plan.moves],
                     [values[i] for idx, _, _ in flights for i in idx], outs, f"{text} pull groups")
        pushes = []
        for idx in reversed(index):  # the executor's push stream: every group posted (start), head first, then waited
            plan = planner.push(idx, itemsize=8)
            xs = [torch.from_numpy(sh[rank]) if rank in sh else None
                  for sh in (shard(mv.src, values[i], rng) for mv, i in zip(plan.moves, idx))]
            pushes.append((idx, plan, start(plan, xs, groups, dtype=torch.float64)))
            del xs  # start() no longer needs its inputs
        for idx, plan, fl in pushes:
            gather_check([mv.dst for mv in plan.moves], [values[i] for i in idx], fl.wait(),
                         f"{text} push group {idx[0]}")
    return failures


@pytest.mark.distributed
def test_local_plans_execute_exactly_on_8_gloo_ranks():
    from tidal.runtime.launch import run_distributed

    cases = [("tiny-tied", "tp2pp2+2*tp1pp2", 4), ("tiny", "tp2cp2+2*tp2", 2), ("tiny-tied", "tp4pp2", 8),
             ("odd", "pp2cp2+tp2+2*tp1", 4)]
    results = run_distributed(_exec_worker, 8, cases, timeout_s=120)
    assert all(not r for r in results), "\n".join(x for r in results for x in r[:5])
