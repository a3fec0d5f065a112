"""The communication-order replay (runtime/commcheck.py) on hand-written traces: deadlocks NCCL would hit and gloo
hides, grouped operations, buffered sends, mismatched collective sequences, and the first-call rule."""

import pytest

from tidal.runtime.commcheck import P2P, Op, replay

pytestmark = [pytest.mark.unit, pytest.mark.comm_order]

G01 = ("g01", (0, 1))  # one communicator over ranks 0 and 1
G10 = ("g10", (0, 1))  # a second communicator over the same ranks
MB = 1 << 20


def send(peer, nbytes=MB, g=G01, blocking=True):
    return Op("p2p", g[0], g[1], parts=(P2P("send", peer, nbytes),), blocking=blocking)


def recv(peer, nbytes=MB, g=G01, blocking=True):
    return Op("p2p", g[0], g[1], parts=(P2P("recv", peer, nbytes),), blocking=blocking)


def batch(*parts, g=G01):
    return Op("batch", g[0], g[1], parts=tuple(P2P(op, peer, n) for op, peer, n in parts), blocking=False)


def coll(kind="all_reduce", nbytes=8, g=G01):
    return Op(kind, g[0], g[1], nbytes)


def wait(ref):
    return Op("wait", ref=ref)


def test_matched_send_and_receive_complete():
    rep = replay([[send(1)], [recv(0)]])
    assert rep.ok and (rep.completed, rep.total) == (2, 2)


def test_head_to_head_sends_deadlock_unless_buffered():
    traces = [[send(1), recv(1)], [send(0), recv(0)]]
    rep = replay(traces)
    assert rep.deadlock and (rep.completed, rep.total) == (0, 4)
    assert "rank 0 waits on op 0" in rep.stuck[0]
    assert replay(traces, buffer_bytes=MB).ok  # both sends fit the buffer: gloo's behaviour
    assert replay(traces, buffer_bytes=MB - 1).deadlock


def test_isend_then_blocking_recv_on_one_communicator_deadlocks():
    """The old pipeline order: each side posts an isend, then a blocking recv, on the same group."""
    traces = [[send(1, blocking=False), recv(1), wait(0)], [send(0, blocking=False), recv(0), wait(0)]]
    assert replay(traces).deadlock
    # the same calls with each direction on a communicator of its own progress
    split = [[send(1, g=G01, blocking=False), recv(1, g=G10), wait(0)],
             [send(0, g=G10, blocking=False), recv(0, g=G01), wait(0)]]
    assert replay(split).ok


def test_a_batch_progresses_as_one_unit():
    traces = [[batch(("send", 1, MB), ("recv", 1, MB)), wait(0)], [batch(("recv", 0, MB), ("send", 0, MB)), wait(0)]]
    rep = replay(traces)
    assert not rep.deadlock and rep.completed == rep.total == 4
    assert rep.first_call  # but a batch is the group's first call
    assert replay([[coll(), *t] for t in traces]).ok  # after a warm-up collective: no finding (waits re-indexed)


def test_waits_index_ops_and_block_until_done():
    # rank 1 never receives: the isend stays incomplete and rank 0's wait is where it stops
    rep = replay([[send(1, blocking=False), wait(0)], [coll("barrier", 0, g=("w", (1,)))]])
    assert rep.deadlock and "rank 0 waits on op 1" in rep.stuck[0]
    assert any("1 sends 0 -> 1, 0 receives" in m for m in rep.mismatches)


def test_collectives_must_match_in_order_kind_and_bytes():
    rep = replay([[coll("all_reduce"), coll("broadcast")], [coll("broadcast"), coll("all_reduce")]])
    assert "differ" in rep.mismatches[0] and not rep.ok  # matched by position (as NCCL would), reported as such
    rep = replay([[coll(nbytes=8)], [coll(nbytes=16)]])
    assert rep.mismatches and not rep.deadlock
    rep = replay([[coll(), coll()], [coll()]])
    assert rep.mismatches and rep.deadlock


def test_object_collectives_compare_kind_only():
    assert replay([[coll("all_gather_object", None)], [coll("all_gather_object", None)]]).ok


def test_collectives_on_two_groups_in_opposite_orders_deadlock():
    a, b = ("ga", (0, 1)), ("gb", (0, 1))
    rep = replay([[coll(g=a), coll(g=b)], [coll(g=b), coll(g=a)]])
    assert rep.deadlock and not rep.mismatches and rep.completed == 0


def test_three_ranks_ring_of_blocking_sends_deadlocks_and_batched_ring_does_not():
    g = ("ring", (0, 1, 2))
    ring = [[send((r + 1) % 3, g=g), recv((r - 1) % 3, g=g)] for r in range(3)]
    assert replay(ring).deadlock
    batched = [[coll(g=g), batch(("send", (r + 1) % 3, MB), ("recv", (r - 1) % 3, MB), g=g), wait(1)]
               for r in range(3)]
    assert replay(batched).ok


def test_message_sizes_must_agree_and_group_creation_order():
    rep = replay([[send(1, 8)], [recv(0, 16)]])
    assert any("sends 8 B into 16 B" in m for m in rep.mismatches)
    made = [[Op("new_group", ranks=(0, 1)), Op("new_group", ranks=(1, 2))],
            [Op("new_group", ranks=(1, 2)), Op("new_group", ranks=(0, 1))]]
    assert any("creates process groups in another order" in m for m in replay(made).mismatches)
