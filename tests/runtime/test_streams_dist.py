"""The executor's pull window and backward-overlapped push (runtime/streams.py, decision 75) on 4 gloo ranks: a
tied model under `pp2+2*tp1` (pushes reduced at roots from 3 addends) and `pp4` (one addend, sent straight to the
owners), 4 micro-batches per pipeline, float64. With windows of 2 (the defaults) and of 1, and with the push
overlapped, the master weights after both steps equal bitwise those of posting every group at once with the push
after the backward (the roots sum addends in plan order whatever the timing); the overlapped runs post pushes
inside the backward; every run's calls pass the NCCL-order replay with every send blocking until matched."""

import numpy as np
import pytest

from tidal.runtime.commcheck import replay
from tidal.runtime.launch import run_distributed

from _stream_cases import CONFIGS, streams_worker  # isort: skip

pytestmark = [pytest.mark.distributed, pytest.mark.comm_order]


@pytest.fixture(scope="module")
def runs():
    return run_distributed(streams_worker, 4, timeout_s=600)


def test_windows_and_overlap_train_bitwise_alike(runs):
    ref = len(CONFIGS) - 1
    for r in runs:
        for c in range(len(CONFIGS) - 1):
            for a, b in zip(r[c]["master"], r[ref]["master"]):
                assert np.array_equal(a, b), CONFIGS[c]


def test_overlapped_push_posts_inside_the_backward(runs):
    for c, opts in enumerate(CONFIGS):
        posted = [n for r in runs for n in r[c]["overlapped"]]
        if opts.get("overlap_push", True):
            assert max(posted) > 0, (opts, posted)
        else:
            assert max(posted) == 0, (opts, posted)


@pytest.mark.parametrize("c", range(len(CONFIGS)))
def test_stream_orders_pass_the_replay(runs, c):
    rep = replay([r[c]["ops"] for r in runs], buffer_bytes=0)
    assert rep.ok, rep
    assert rep.completed == rep.total > 0
