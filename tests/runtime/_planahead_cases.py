"""Picklable planner factories for the plan-ahead tests (a spawned planner process imports them by name)."""

from __future__ import annotations

import dataclasses
import os
import time

from tidal.runtime.train import train_worker


@dataclasses.dataclass(frozen=True)
class Faulty:
    """A factory of planners that wrap `inner()` and, at step `at`, raise (`how="raise"`), exit the process without
    a word (`"exit"`) or hang (`"hang"`); `at=-1` raises while the planner is being built."""

    inner: object
    at: int
    how: str = "raise"

    def __call__(self):
        if self.at < 0:
            raise RuntimeError("cannot build the planner")
        return _FaultyPlanner(self.inner(), self.at, self.how)


class _FaultyPlanner:
    def __init__(self, planner, at: int, how: str) -> None:
        self.planner, self.at, self.how, self.k = planner, at, how, 0

    def next(self):
        if self.k == self.at:
            if self.how == "exit":
                # os._exit skips the queue's feeder thread: give it time to send the plans already put, so the test
                # sees them before the death (without the pause, plan 0 can be lost with the process, seen once in CI)
                time.sleep(2.0)
                os._exit(3)
            if self.how == "hang":
                time.sleep(60)
            raise ValueError(f"boom at step {self.k}")
        self.k += 1
        return self.planner.next()

    def state_dict(self) -> dict:
        return self.planner.state_dict()

    def load_state_dict(self, d: dict) -> None:
        self.planner.load_state_dict(d)


def rotate(planner) -> None:
    """A planner update (as an online refit would send): plan step k on candidate k mod S from now on."""
    planner.options = dataclasses.replace(planner.options, rotate=True)


def jobs_worker(rank: int, world: int, jobs: list) -> list:
    """train_worker on every job in turn; rank 0's results."""
    return [r for r in (train_worker(rank, world, job, record=True) for job in jobs) if rank == 0]


def faulty_worker(rank: int, world: int, job, factory) -> None:
    train_worker(rank, world, job, plan_factory=factory)


def orphan_maker(factory, q) -> None:
    """A trainer that dies without closing its background planner (as a rank killed by its launcher)."""
    from tidal.runtime.planahead import BackgroundPlans

    bg = BackgroundPlans(factory, 1)
    bg.next()  # the process is up, and soon blocked on a full queue
    q.put(bg._proc.pid)
    q.close()
    q.join_thread()  # the pid reaches the pipe before the exit below skips every cleanup
    os._exit(0)
