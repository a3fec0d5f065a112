"""The communication-order checker (runtime/commcheck.py) on real runs: every rank's torch.distributed calls are
recorded on gloo and replayed under NCCL's rules (per-group FIFO, grouped batch_isend_irecv, collectives that need
every member, receives that wait for their send, and sends that block until matched: buffer_bytes = 0, so every
message is above the buffer). Must hold: no deadlock, identical collective sequences on every group's members,
message sizes that agree, every group created in one order, and no batched p2p as a group's first call.

The old pipeline order (an isend then a blocking recv between the same two ranks, on one group) must fail it."""

import dataclasses

import pytest

from tidal.runtime.commcheck import replay
from tidal.runtime.launch import run_distributed
from tidal.runtime.train import prepare

from _comm_cases import PIPELINES, pipelines_worker, training_worker  # isort: skip
from test_executor import CASES, _config  # isort: skip

pytestmark = [pytest.mark.distributed, pytest.mark.comm_order]
RTOL = 1e-5  # fp32 gradients against one process (as test_parallel_equivalence)


@pytest.fixture(scope="module")
def pipelines():
    return run_distributed(pipelines_worker, 4, timeout_s=600)


@pytest.mark.parametrize("name", [p[0] for p in PIPELINES])
def test_pipeline_schedules_pass_the_replay(pipelines, name):
    rep = replay([r[name]["ops"] for r in pipelines], buffer_bytes=0)
    assert rep.ok, rep
    assert rep.completed == rep.total > 0
    for r in pipelines:
        if r[name]["err"] is not None:
            assert r[name]["err"] <= RTOL, (name, r[name]["err"])


def test_full_recompute_repeats_the_layer_collectives_in_the_backward(pipelines):
    """Full recomputation (decision 90) runs each layer's TP/SP (and CP) collectives again inside the backward:
    more collectives than the plain run, still the same sequence on every member (the replay above)."""
    def collectives(name):
        return sum(1 for r in pipelines for op in r[name]["ops"]
                   if op.kind not in ("p2p", "batch", "wait", "new_group"))

    assert collectives("1f1b tp2pp2 sp full") > collectives("1f1b tp2pp2 sp")
    assert collectives("1f1b cp2pp2 full") > collectives("1f1b cp2pp2")


def test_pipeline_messages_are_paired_batches_on_pair_groups(pipelines):
    """1F1B at pp4: every activation message is in a batch_isend_irecv on a 2-rank group, no single send/recv."""
    ops = [op for r in pipelines for op in r["1f1b pp4"]["ops"]]
    assert not [op for op in ops if op.kind == "p2p"]
    batches = [op for op in ops if op.kind == "batch"]
    assert batches and all(len(op.ranks) == 2 for op in batches)
    assert any(len(op.parts) == 2 for op in batches)  # send_forward_recv_backward and the like


@pytest.mark.parametrize("pp,total", [(2, 32), (4, 96)])
def test_old_1f1b_order_deadlocks(pipelines, pp, total):
    traces = [r[f"old pp{pp}"]["ops"] for r in pipelines]
    rep = replay(traces, buffer_bytes=0)
    assert rep.deadlock, rep
    assert rep.total == total + len(traces)  # the p2p operations plus the opening barrier of every rank
    # reported in docs/runtime.md: operations completed before the deadlock, the barrier excluded
    done = {2: 4, 4: 24}[pp]
    assert rep.completed - len(traces) == done, rep
    # headers (64 B) buffered, tensors not: the count (pp2 6 of 32, pp4 28 of 96)
    rep = replay(traces, buffer_bytes=64)
    assert rep.deadlock and rep.completed - len(traces) == {2: 6, 4: 28}[pp], rep
    assert replay(traces, buffer_bytes=1 << 20).ok  # what gloo's buffering lets through


@pytest.fixture(scope="module")
def trainings():
    jobs = [prepare(_config(m, s, steps=2), 8) for _, m, s in CASES]
    sp = _config("tiny-tied", "tp2pp2+2*tp1pp2;tp4+tp2+2*tp1", steps=2)  # sequence parallelism
    jobs.append(prepare(dataclasses.replace(sp, train=dataclasses.replace(sp.train, sequence_parallel=True)), 8))
    return run_distributed(training_worker, 8, jobs, timeout_s=1500)


@pytest.mark.parametrize("i", range(len(CASES) + 1), ids=[c[0] for c in CASES] + ["sp"])
def test_verify_strategies_pass_the_replay(trainings, i):
    traces = [r[i] for r in trainings]
    rep = replay(traces, buffer_bytes=0)
    assert rep.ok, rep
    assert rep.completed == rep.total
    kinds = {op.kind for t in traces for op in t}
    assert {"batch", "all_reduce", "broadcast_object_list"} <= kinds, kinds
