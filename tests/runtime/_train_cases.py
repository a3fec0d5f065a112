"""Worker bodies for the executor tests: several training jobs in one spawn (a spawn of 8 ranks costs more than
a job)."""

from __future__ import annotations

from tidal.runtime.train import train_worker


def jobs_worker(rank: int, world: int, jobs: list) -> list:
    """Run every job in turn on this rank (fresh groups and executor each time); results from rank 0 only."""
    out = []
    for job in jobs:
        res = train_worker(rank, world, job, record=True)
        out.append(res if rank == 0 else None)
    return out
