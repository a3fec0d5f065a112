"""Pure planning tests: annotations, tier classification, collective detection, heuristics, volumes. Every plan is
executed by the numpy simulator and compared exactly with the reference layout (integer-valued float64: exact)."""

import numpy as np
import pytest

from tidal.core import TidalError
from tidal.runtime.reshard import (
    DUPLICATE,
    PARTIAL,
    Annotation,
    DistributedStates,
    Resolver,
    TensorMove,
    Topology,
    classify,
    resolve,
)
from tidal.runtime.reshard.simulate import simulate
from tidal.runtime.reshard.testing import check, make_global, random_case, shard

pytestmark = pytest.mark.unit

DS = DistributedStates.make


def run(src, dst, shape, topo=None, seed=0, heuristics=True):
    rng = np.random.default_rng(seed)
    value = make_global(rng, shape)
    shards = shard(src, value, rng)
    plan = resolve(src, dst, shape, topo, itemsize=8, heuristics=heuristics)
    out = simulate(plan, {r: [x] for r, x in shards.items()})
    err = check(dst, value, {r: o[0] for r, o in out.items() if o[0] is not None})
    assert err is None, err
    return plan


def test_entries_mixed_radix_and_uneven_splits():
    ann = Annotation.spmd([3, 1, 2, 0], {0: 2, DUPLICATE: 2}, order=(0, DUPLICATE))
    boxes = {e.device: e.box for e in ann.entries((5, 4))}
    assert boxes == {3: ((0, 3), (0, 4)), 1: ((0, 3), (0, 4)), 2: ((3, 5), (0, 4)), 0: ((3, 5), (0, 4))}
    u = Annotation.union([([0, 1], DS({1: 2})), ([2], DS()), ([3], DS())], hdim=0, hweights=[2, 1, 1])
    assert [e.box for e in u.entries((8, 4))] == [((0, 4), (0, 2)), ((0, 4), (2, 4)), ((4, 6), (0, 4)),
                                                  ((6, 8), (0, 4))]


@pytest.mark.parametrize("bad", [
    lambda: Annotation.spmd([0, 1, 2], {0: 2}),
    lambda: Annotation.union([([0, 1], DS({0: 2})), ([1], DS())]),
    lambda: Annotation.union([([0], DS()), ([1], DS())], hdim=0, hweights=[1]),
    lambda: DS({0: 0}),
    lambda: DS({0: 2, 1: 2}, order=(0,)),
    lambda: resolve(Annotation.spmd([0, 1], {2: 2}), Annotation.spmd([0, 1]), (4, 4)),
    lambda: Resolver(Topology.uniform(2)).plan([TensorMove(Annotation.spmd([0, 5]), Annotation.spmd([0]), (2,))]),
])
def test_bad_input_raises_tidal_error(bad):
    with pytest.raises(TidalError):
        bad()


def test_identity_and_sr():
    a = Annotation.spmd([0, 1], {0: 2})
    p = run(a, a, (4, 3))
    assert p.tiers == ("identity",) and p.num_messages == 0 and p.max_send() == 0
    b = Annotation.spmd([2, 3], {0: 2})
    p = run(a, b, (4, 3))
    assert p.tiers == ("bottom",) and p.op_counts()["SR"] == 2 and not p.collectives


@pytest.mark.parametrize("src,dst,op", [
    ({PARTIAL: 4}, {DUPLICATE: 4}, "AR"),
    ({PARTIAL: 4}, {0: 4}, "RS"),
    ({0: 4}, {DUPLICATE: 4}, "AG"),
    ({1: 4}, {DUPLICATE: 4}, "AG"),
    ({PARTIAL: 2, 1: 2}, {DUPLICATE: 2, 1: 2}, "AR"),
])
def test_bottom_tier_collectives(src, dst, op):
    p = run(Annotation.spmd(range(4), src), Annotation.spmd(range(4), dst), (8, 8))
    assert p.tiers == ("bottom",)
    assert set(p.op_counts()) == {op} | ({"copy"} if op == "AG" else set())
    assert p.num_messages == 0


def test_top_tier_split_collectives():
    tp2 = DS({1: 2})
    partial = Annotation.union([([0, 1], tp2), ([2, 3], tp2)], hdim=PARTIAL)
    dup = Annotation.union([([0, 1], tp2), ([2, 3], tp2)], hdim=DUPLICATE)
    rows = Annotation.union([([0, 1], tp2), ([2, 3], tp2)], hdim=0)
    assert classify(partial, dup) == "top"
    assert set(run(partial, dup, (4, 6)).op_counts()) == {"SplitAR"}
    assert set(run(partial, rows, (4, 6)).op_counts()) == {"SplitRS"}
    assert set(run(rows, dup, (4, 6)).op_counts()) - {"copy"} == {"SplitAG"}
    # Hetu Fig. 7: subgroups with different DS (tp2 partial inside + tp1) -> one SplitAR per slice.
    het = Annotation.union([([0, 1], DS({PARTIAL: 2})), ([2], DS())], hdim=PARTIAL)
    het_dup = Annotation.union([([0, 1], DS({1: 2})), ([2], DS())], hdim=DUPLICATE)
    p = run(het, het_dup, (4, 6))
    assert dict(p.op_counts()) == {"SplitAR": 1} and p.num_messages == 0


def test_heuristics_prefer_local_then_fast_links_then_balance():
    topo = Topology.uniform(8, 4)
    src = Annotation.union([(range(4), DS({0: 4})), (range(4, 8), DS({0: 4}))])  # two replicas, one per node
    dst = Annotation.spmd(range(8), {0: 8})
    p = run(src, dst, (8, 2), topo)
    assert p.inter_node_bytes() == 0  # every receiver finds its rows on its own node
    naive = run(src, dst, (8, 2), topo, heuristics=False)
    assert naive.inter_node_bytes() > 0 and naive.total_bytes() == p.total_bytes()
    # balance: 4 equal senders on one node feeding 4 receivers that need everything
    src = Annotation.spmd(range(4), {DUPLICATE: 4})
    dst = Annotation.spmd(range(4, 8), {DUPLICATE: 4})
    p = run(src, dst, (4, 4), Topology.uniform(8))
    sends = [p.stats[r].send for r in range(4)]
    assert max(sends) == min(sends)


@pytest.mark.parametrize("seed", range(300))
def test_random_pairs_simulated(seed):
    shape, src, dst, value, shards = random_case(seed, 8)
    plan = Resolver(Topology.uniform(8, 4), 8).plan([TensorMove(src, dst, shape)])
    out = simulate(plan, {r: [x] for r, x in shards.items()})
    assert check(dst, value, {r: o[0] for r, o in out.items() if o[0] is not None}) is None


def test_execution_rejects_wrong_local_shards():
    torch = pytest.importorskip("torch")
    from tidal.runtime.reshard.execute import _Local

    plan = resolve(Annotation.spmd([0, 1], {0: 2}), Annotation.spmd([0, 1], {DUPLICATE: 2}), (4, 3))
    _Local(plan, 0, [torch.zeros(2, 3)], torch.float32)  # the right shard is accepted
    with pytest.raises(TidalError):
        _Local(plan, 0, [torch.zeros(4, 3)], torch.float32)  # global instead of local shape
    with pytest.raises(TidalError):
        _Local(plan, 0, [None], torch.float32)
    with pytest.raises(TidalError):
        _Local(plan, 0, [torch.zeros(2, 3, dtype=torch.float64)], torch.float32)
    with pytest.raises(TidalError):
        _Local(plan, 0, [], torch.float32)


def test_all_gather_within_replicas():
    """{dup:2, split0:2} -> {dup:4}: two AGs, one per replica pair, no point-to-point messages."""
    src = Annotation.spmd(range(4), {DUPLICATE: 2, 0: 2}, order=(DUPLICATE, 0))
    p = run(src, Annotation.spmd(range(4), {DUPLICATE: 4}), (8, 3))
    assert p.op_counts()["AG"] == 2 and p.num_messages == 0
    assert sorted(c.ranks for c in p.collectives) == [(0, 1), (2, 3)]
