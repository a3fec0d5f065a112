"""Pure checks of the pipeline schedules and stage splitting (no process group)."""

import dataclasses

import pytest

from tidal.core import TidalError, get_model
from tidal.models import Llama
from tidal.runtime.pp import exchanges, schedule_1f1b, schedule_gpipe, split_stage, stage_layer_range

pytestmark = pytest.mark.unit


def _in_flight(actions):
    live, peak = set(), 0
    for kind, i in actions:
        if kind == "F":
            live.add(i)
        else:
            assert i in live, "backward before forward"
            live.remove(i)
        peak = max(peak, len(live))
    assert not live
    return peak


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_schedules(pp, m):
    for stage in range(pp):
        a = schedule_1f1b(m, pp, stage)
        g = schedule_gpipe(m, pp, stage)
        assert sorted(a) == sorted(g) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert _in_flight(a) == min(pp - stage, m)
        assert _in_flight(g) == m
        assert [i for k, i in a if k == "B"] == [i for k, i in g if k == "B"] == list(range(m))


def test_uneven_split():
    spec = dataclasses.replace(get_model("tiny"), layers=6)
    split = (2, 1, 1, 2)
    assert [list(stage_layer_range(split, s)) for s in range(4)] == [[0, 1], [2], [3], [4, 5]]
    m = split_stage(Llama(spec, "reference"), split, 3)
    assert list(m.layers) == ["4", "5"] and m.tok_embeddings is None and m.output is not None
    m = split_stage(Llama(spec, "reference"), split, 0)
    assert list(m.layers) == ["0", "1"] and m.norm is None and m.output is None
    with pytest.raises(TidalError):
        split_stage(Llama(spec, "reference"), (3, 2), 0)
    with pytest.raises(TidalError):
        schedule_1f1b(3, 2, 2)


def _exchange_traces(schedule, m: int, pp: int, nbytes: int = 1 << 20):
    """What pp.execute posts, as commcheck records: per exchange, one batch per neighbour on that stage pair's
    group (after the pair's warm-up all-reduce), waited at once."""
    from tidal.runtime.commcheck import P2P, Op

    def group(a):
        return (f"pair{a}", (a, a + 1))

    traces = []
    for s in range(pp):
        ops = [Op("all_reduce", *group(a), 4) for a in range(pp - 1) if s in (a, a + 1)]
        for ex in exchanges(schedule(m, pp, s), first=s == 0, last=s == pp - 1):
            posted = []
            for side in ("prev", "next"):
                parts = tuple(P2P(op, s - 1 if side == "prev" else s + 1, nbytes) for op, sd, _ in ex if sd == side)
                if parts:
                    g = group(s - 1 if side == "prev" else s)
                    ops.append(Op("batch", g[0], g[1], parts=parts, blocking=False))
                    posted.append(len(ops) - 1)
            ops += [Op("wait", ref=j) for j in posted]
        traces.append(ops)
    return traces


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp", [2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_exchanges_pair_up_and_replay_without_deadlock(name, pp, m):
    """Every send has its receive in the neighbour's exchanges (same micro-batch, opposite direction), and the
    exchanges replayed under NCCL's rules with every send blocking until matched complete."""
    from tidal.runtime.commcheck import replay

    schedule = {"1f1b": schedule_1f1b, "gpipe": schedule_gpipe}[name]
    plans = [exchanges(schedule(m, pp, s), first=s == 0, last=s == pp - 1) for s in range(pp)]
    for s, plan in enumerate(plans):
        assert len(plan) == 2 * m + 1
        sent = [(side, i) for ex in plan for op, side, i in ex if op == "send"]
        got = [(side, i) for ex in plan for op, side, i in ex if op == "recv"]
        assert sorted(sent) == sorted(([("next", i) for i in range(m)] if s < pp - 1 else []) +
                                      ([("prev", i) for i in range(m)] if s > 0 else []))
        assert sorted(got) == sorted(sent)  # an activation and a gradient each way per micro-batch
        assert all(len([x for x in ex if x[0] == "recv"]) <= 1 for ex in plan)
    rep = replay(_exchange_traces(schedule, m, pp), buffer_bytes=0)
    assert rep.ok and rep.completed == rep.total, rep


def test_1f1b_steady_state_pairs_like_megatron():
    """Middle stage of pp3, 4 micro-batches: send_forward_recv_backward after a forward, send_backward_recv_forward
    after a backward, each one batch with one neighbour."""
    plan = exchanges(schedule_1f1b(4, 3, 1), first=False, last=False)
    assert plan[0] == (("recv", "prev", 0),)
    assert plan[1] == (("send", "next", 0), ("recv", "prev", 1))  # warm-up: two neighbours, two batches
    assert plan[2] == (("send", "next", 1), ("recv", "next", 0))  # send_forward_recv_backward
    assert plan[3] == (("send", "prev", 0), ("recv", "prev", 2))  # send_backward_recv_forward
    assert plan[-1] == (("send", "prev", 3),)


def test_unpaired_exchanges_deadlock():
    """The same messages with each send completed before the receive is posted (no pairing) deadlock 1F1B at pp2."""
    from tidal.runtime.commcheck import Op, replay

    traces = []
    for ops in _exchange_traces(schedule_1f1b, 4, 2):
        split = []
        for op in ops:
            if op.kind == "batch":
                for part in sorted(op.parts, key=lambda p: p.op != "send"):  # sends first, each waited
                    split += [Op("batch", op.comm, op.ranks, parts=(part,), blocking=False),
                              Op("wait", ref=len(split))]
            elif op.kind != "wait":
                split.append(op)
        traces.append(split)
    rep = replay(traces, buffer_bytes=0)
    assert rep.deadlock and rep.completed < rep.total
