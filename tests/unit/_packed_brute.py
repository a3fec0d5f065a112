"""Shared by the gap-probe tests (test_repair, test_gap_whole): small one-stage pipelines, the least packed step
time of a small step by brute force over every dispatch (each pipeline packed in its fewest micro-batches), and the
loader of a benchmarks/ script as a module."""

import importlib
import itertools
import sys
from pathlib import Path

import numpy as np

from tidal.planner.bounds import PipeCost
from tidal.proof.binpack import min_bins

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def three_pipes() -> list[PipeCost]:
    return [PipeCost(1e-4, 0.01, 0.05, 1, 20), PipeCost(1e-4, 0.01, 0.05, 1, 20), PipeCost(5e-5, 0.006, 0.08, 1, 32)]


def least_packed_time(l_: np.ndarray, pipes: list[PipeCost]) -> float:
    """min over every dispatch of max over pipelines of (fewest micro-batches) x c + work: one-stage pipelines."""
    best = np.inf
    for assign in itertools.product(range(len(pipes)), repeat=l_.size):
        t = 0.0
        for j, p in enumerate(pipes):
            g = l_[[i for i, a in enumerate(assign) if a == j]]
            if g.size and int(g.max()) > p.max_len:
                t = np.inf
                break
            if g.size:
                t = max(t, min_bins(g, p.max_len)[0] * p.c + float(p.work(g).sum()))
        best = min(best, t)
    return best


def small_steps(seed: int, count: int, size: int, pipes: list[PipeCost]):
    """`count` seeded random steps of `size` documents (3-20 tokens), each with its least packed time on `pipes`."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        l_ = rng.integers(3, 21, size=size).astype(np.int64)
        yield l_, least_packed_time(l_, pipes)
