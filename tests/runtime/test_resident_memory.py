"""Resident bytes per rank against the memory model (costmodel/memory.py `resident_bytes`), measured on gloo ranks by
tensor-storage accounting (runtime/resident.py): within 10 % at each of the step's pull, backward and push peaks, on
every rank, and the same whatever the number of candidates (an idle candidate holds nothing). Bytes, not time, so the
bound is asserted. The full table (6 strategies x 1, 2, 4 candidates) is benchmarks/resident_memory.py."""

import pytest

from tidal.runtime.launch import run_distributed
from tidal.runtime.resident import measure_worker, worst

pytestmark = pytest.mark.distributed

STRATEGIES = ("4*tp1", "tp2pp2", "tp1cp2+tp2")


@pytest.fixture(scope="module")
def rows():
    cases, keys = [], []
    for i, s in enumerate(STRATEGIES):
        for n in (1, 3):
            cases.append([STRATEGIES[(i + j) % len(STRATEGIES)] for j in range(n)])
            keys.append((s, n))
    res = run_distributed(measure_worker, 4, "small", cases, "float32", "float32", timeout_s=900)
    return {k: [res[r][c] for r in range(4)] for c, k in enumerate(keys)}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resident_bytes_match_the_memory_model(rows, strategy):
    for n in (1, 3):
        _, _, err, at = worst(rows[(strategy, n)])
        assert err <= 0.10, (strategy, n, err, at)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_idle_candidates_hold_nothing(rows, strategy):
    one, three = rows[(strategy, 1)], rows[(strategy, 3)]
    for a, b in zip(one, three):
        for phase, v in a["measured"].items():
            assert abs(b["measured"][phase] - v) <= 0.01 * v, (strategy, a["rank"], phase, v, b["measured"][phase])
