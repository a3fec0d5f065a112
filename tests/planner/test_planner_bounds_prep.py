"""Work shared across a step's candidates gives the same numbers: per-step lengths (prepare_lengths), per-candidate
class arrays (ClassArrays), and the two-stage StrategyBound; and assign keeps the faster of its two dispatches."""

import numpy as np
import pytest
from planner_synth import MAX_LEN, PROFILES

from tidal.planner.bounds import ClassArrays, StrategyBound, group_pipes, prepare_lengths, strategy_bound
from tidal.planner.dispatch import dispatch_alternatives
from tidal.planner.packing import pack
from tidal.planner.passes import pack_groups
from tidal.planner.select import assign

pytestmark = pytest.mark.unit


def _steps(seed, n=60):
    rng = np.random.default_rng(seed)
    for t in range(n):
        size = int(rng.integers(1, 200))
        l_ = rng.integers(1, MAX_LEN + 1, size=size).astype(np.int64)
        if t % 3 == 0:
            l_ = rng.choice(l_[:4], size=size)  # repeated lengths
        yield l_


def test_shared_bound_work_gives_the_same_bounds():
    for l_ in _steps(0):
        prep = prepare_lengths(l_)
        for prof in PROFILES:
            if int(l_.max()) > prof.max_len:
                assert StrategyBound(l_, prof.pipes, prep=prep).quick == float("inf")
                continue
            arrays = ClassArrays.of(group_pipes(prof.pipes))
            sb = StrategyBound(l_, prof.pipes, arrays=arrays, prep=prep)
            assert sb.quick == strategy_bound(l_, prof.pipes, top=0, timed=False)
            assert sb.refined() == strategy_bound(l_, prof.pipes)
            assert strategy_bound(l_, prof.pipes, arrays=arrays, prep=prep) == strategy_bound(l_, prof.pipes)


def test_assign_keeps_the_faster_of_first_dispatch_and_best_restart():
    """Restarts (and the jump-scan greedy) minimise the dispatch objective, a bound on packed time: assign packs each
    and is never slower than the first dispatch (or any alternative) packed alone."""
    for l_ in _steps(1, 40):
        for prof in PROFILES:
            if int(l_.max()) > prof.max_len:
                continue
            est = assign(l_, prof, fallback=False)[0]
            first, alts = dispatch_alternatives(l_, prof.pipes)
            assert est <= pack_groups(l_, prof, first.groups, pack, False)[0]
            for alt in alts:
                assert alt.objective < first.objective
                assert est <= pack_groups(l_, prof, alt.groups, pack, False)[0]


def test_prepare_lengths_is_the_per_quantity_computation():
    """Decision 120: prepare_lengths takes its four quantiles in one np.quantile call and the counts from np.unique;
    the same floats (bit for bit) as each quantity computed on its own, as before."""
    rng = np.random.default_rng(7)
    for l_ in list(_steps(5)) + [rng.lognormal(6, 1.5, int(n)).round() for n in rng.integers(1, 3000, 40)]:
        full = np.asarray(l_, dtype=np.float64)
        uniq, inv = np.unique(full, return_inverse=True)
        p = prepare_lengths(l_)
        assert np.array_equal(p.uniq, uniq) and p.wt.dtype == np.float64
        assert np.array_equal(p.wt, np.bincount(inv.ravel(), weights=np.ones_like(full), minlength=uniq.size))
        assert np.array_equal(p.refs, np.unique(np.quantile(full, [0.0, 0.5, 0.9, 1.0])))
        assert p.ref90 == float(np.quantile(full, 0.9))
