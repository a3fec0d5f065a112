"""The spawning launcher fails fast and names the rank: a rank that dies without reporting, one that raises, and a
hang past the timeout (none of these may wait for the other ranks' 120 s sleeps). Timeouts leave room for a slow
start-up (three processes importing torch on two busy cores)."""

import os
import time

import pytest

from tidal.runtime.launch import run_distributed

from _launch_cases import (dies_on_rank1, dies_then_peer_raises, hangs, holds_a_named_semaphore, ok,  # isort: skip
                           raises_on_rank2)

pytestmark = pytest.mark.distributed


def test_results_in_rank_order():
    assert run_distributed(ok, 3, 5, timeout_s=60) == [0, 5, 10]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="named semaphores are files in /dev/shm on Linux only")
def test_a_rank_leaves_no_named_semaphore_behind():
    """Decision 160: a rank leaves by os._exit after reporting, which skips multiprocessing's exit finalizers; they
    are run first, so a named semaphore the rank still holds (tqdm's lock under torch.compile) is unlinked instead of
    being reported leaked by the resource tracker when the launcher exits."""
    names = run_distributed(holds_a_named_semaphore, 2, timeout_s=60)
    assert len(set(names)) == 2
    assert not [n for n in names if os.path.exists("/dev/shm/sem." + n.lstrip("/"))]


@pytest.mark.parametrize("fn,msg", [(dies_on_rank1, "rank 1 died with exit code 3"),
                                    (raises_on_rank2, "rank 2 raised"),
                                    (hangs, "timed out after 45 s waiting for ranks")])
def test_failures_name_the_rank_and_return_early(fn, msg):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="distributed worker failed") as e:
        run_distributed(fn, 3, timeout_s=45)
    assert msg in str(e.value), str(e.value)
    if fn is raises_on_rank2:
        assert "ValueError: boom on rank 2" in str(e.value)  # the rank's traceback travels with the error
    if fn is hangs:
        assert "1, 2]" in str(e.value)
    assert time.monotonic() - t0 < 100


def test_a_dead_rank_is_named_before_the_peer_it_broke():
    """A peer's error caused by a dead rank can reach the launcher before the death does (CI saw rank 0's gloo
    "Connection closed by peer" reported instead of rank 1's exit): the dead rank is named first, the peer's error
    follows."""
    with pytest.raises(RuntimeError, match="distributed worker failed") as e:
        run_distributed(dies_then_peer_raises, 3, timeout_s=45)
    msg = str(e.value)
    assert "rank 1 died with exit code 3" in msg, msg
    assert "then rank 0 raised" in msg and "Connection closed by peer" in msg, msg
