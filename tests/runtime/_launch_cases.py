"""Worker bodies for the launcher's failure tests (module-level so spawn can pickle them)."""

import os
import time


def dies_on_rank1(rank, world):
    if rank == 1:
        os._exit(3)  # like a crash at import or start-up: no exception, no report
    time.sleep(120)
    return rank


def raises_on_rank2(rank, world):
    if rank == 2:
        raise ValueError("boom on rank 2")
    time.sleep(120)
    return rank


def hangs(rank, world):
    if rank == 0:
        return rank
    time.sleep(120)
    return rank


def ok(rank, world, x):
    return rank * x


def dies_then_peer_raises(rank, world):
    """Rank 1 dies; rank 0 then fails the way a collective with a dead peer does (gloo: "Connection closed by peer")."""
    if rank == 1:
        os._exit(3)
    if rank == 0:
        time.sleep(0.3)  # reports well inside the launcher's 2 s wait after it sees rank 1 dead, whichever comes first
        raise RuntimeError("Connection closed by peer")
    time.sleep(120)
    return rank


def holds_a_named_semaphore(rank, world):
    """Like tqdm's class-level lock that torch.compile creates: a named semaphore alive until the process exits."""
    import multiprocessing

    lock = multiprocessing.get_context("spawn").RLock()
    holds_a_named_semaphore.held = lock  # kept alive past the return, as a class attribute would be
    return lock._semlock.name
