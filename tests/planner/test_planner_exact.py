"""Differential tests: heuristics against the HiGHS MILPs on >= 200 small seeded instances each."""

import numpy as np
import pytest
from planner_synth import PROFILES

from tidal.costmodel import LatencyCoeffs
from tidal.planner.alg1 import dispatch_hydraulis
from tidal.planner.bounds import PipeCost, strategy_bound
from tidal.planner.dispatch import dispatch
from tidal.planner.packing import pack
from tidal.planner.select import assign

pytestmark = [pytest.mark.unit, pytest.mark.slow]

N = 220


def _pipes(rng):
    kinds = [PipeCost(1e-3, 1.0, 0.5, 1, 64), PipeCost(0.5e-3, 0.5, 0.5, 2, 128), PipeCost(2e-4, 0.25, 1.0, 4, 200),
             PipeCost(2e-3, 2.0, 0.1, 1, 40), PipeCost(1e-3, 1.0, 0.2, 1, 64, 5.0)]
    k = rng.integers(1, 4)
    return [kinds[rng.integers(0, len(kinds))] for _ in range(k)]


def _gaps(pairs):
    g = np.array([h / e - 1 for h, e in pairs])
    return float(np.median(g)), float(g.max())


def test_dispatch_heuristic_vs_milp():
    rng = np.random.default_rng(11)
    pairs = []
    for _ in range(N):
        pipes = _pipes(rng)
        top = max(p.max_len for p in pipes)
        lengths = rng.integers(1, top + 1, size=rng.integers(1, 10))
        h = dispatch(lengths, pipes)
        e = dispatch(lengths, pipes, exact=True)
        assert e.objective <= h.objective
        if e.objective > 0:
            pairs.append((h.objective, e.objective))
    med, worst = _gaps(pairs)
    assert med <= 0.01 and worst <= 0.05, (med, worst)


def test_dispatch_at_least_as_good_as_hydraulis_alg1_on_average():
    rng = np.random.default_rng(5)
    ours, theirs = [], []
    for _ in range(60):
        pipes = _pipes(rng)
        top = max(p.max_len for p in pipes)
        lengths = rng.integers(1, top + 1, size=rng.integers(1, 25))
        ours.append(dispatch(lengths, pipes).objective)
        theirs.append(dispatch_hydraulis(lengths, pipes, trials=20, seed=0).objective)
    assert np.mean(np.array(ours) / np.maximum(theirs, 1e-12)) <= 1.0


@pytest.mark.parametrize("pp,c", [(1, 0.5), (3, 2.0), (4, 0.2)])
def test_packing_heuristic_vs_milp(pp, c):
    rng = np.random.default_rng(pp)
    coeffs = LatencyCoeffs(1e-3, 1.0, c)
    pairs = []
    for _ in range(N // 3 + 1):
        lengths = rng.integers(1, 64, size=rng.integers(1, 10))
        max_len = int(rng.integers(64, 160))
        h = pack(lengths, coeffs, pp, max_len)
        e = pack(lengths, coeffs, pp, max_len, exact=True)
        assert e.est_time <= h.est_time * (1 + 1e-12)
        pairs.append((h.est_time, e.est_time))
    med, worst = _gaps(pairs)
    assert med <= 0.01 and worst <= 0.05, (med, worst)


def test_two_stage_heuristic_vs_exact():
    rng = np.random.default_rng(7)
    pairs = []
    for _ in range(N):
        prof = PROFILES[rng.integers(0, len(PROFILES))]
        lengths = rng.integers(1, prof.max_len + 1, size=rng.integers(1, 9))
        h, _ = assign(lengths, prof)
        e, _ = assign(lengths, prof, exact=True)
        assert h >= strategy_bound(lengths, prof.pipes) and e >= strategy_bound(lengths, prof.pipes)
        pairs.append((h, e))
    med, worst = _gaps(pairs)
    assert med <= 0.01 and worst <= 0.05, (med, worst)
