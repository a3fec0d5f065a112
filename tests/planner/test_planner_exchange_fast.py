"""The exchange's shortcuts of decision 142 (issue 27) change no move: the direct placement in one compiled loop
(kernels_batch.fit_first) picks numpy's pipeline and float, also as plain Python; a candidate document whose own
pipeline's time without it is already >= the best move found is not searched, which leaves every run's moves as the
full search's, never slower than its start, and still finds a better move of a later candidate."""

import numpy as np
import pytest

from tidal.planner import kernels_batch
from tidal.planner.bounds import PipeCost
from tidal.planner.exchange import Exchange, exchange

from _plan_cases import random_plan  # isort: skip

pytestmark = pytest.mark.unit


def _pipes(rng, n):
    """n one-stage pipelines of three classes with round coefficients (many exact ties among their times)."""
    kinds = [PipeCost(0.0, 1.0, 2.0, 1, 64), PipeCost(0.0, 0.5, 1.0, 1, 128), PipeCost(1 / 64, 0.25, 1.0, 1, 256)]
    return [kinds[int(k)] for k in rng.integers(0, 3, n)]


def _case(seed, n=24, docs=90):
    rng = np.random.default_rng(seed)
    pipes = _pipes(rng, n)
    l_ = rng.choice([4, 8, 16, 24, 32, 48, 64], docs).astype(np.int64)  # few lengths: equal works and times
    return rng, l_, pipes, random_plan(rng, l_, pipes, skip=lambda j: j % 7 == 3)


@pytest.mark.parametrize("seed", range(6))
def test_direct_placement_is_numpys_pick_compiled_and_plain(seed):
    rng, l_, pipes, bins = _case(seed)
    ex = Exchange(l_, pipes, bins)
    plain = kernels_batch.PLAIN.fit_first
    checked = found = 0
    for _ in range(300):
        x = int(rng.integers(0, l_.size))
        off = sorted({int(r) for r in rng.integers(0, len(pipes), int(rng.integers(0, 4)))})
        limit = float(rng.choice([np.inf, float(ex.t.max()), float(np.median(ex.t)) + 1.0, float(ex.t.min())]))
        want = ex._direct(x, off, limit)  # kernels_batch.loops(): compiled where numba is installed
        got = plain(ex.t, ex.wcol(x), ex.op, ex.room, int(l_[x]), limit, np.array(off, dtype=np.int64))
        assert (int(got[0]), float(got[1])) == want
        # numpy's pick (the pre-142 expression): the least loaded able pipeline with room under limit
        cand = ex.t + ex.wcol(x) + np.where(ex.room == ex.m, ex.c, 0.0)
        ok = (ex.m >= l_[x]) & (ex.room >= l_[x]) & (cand < limit)
        ok[off] = False
        if ok.any():
            r = int(np.flatnonzero(ok)[np.argmin(cand[ok])])
            assert want == (r, float(cand[r]))
            found += 1
        else:
            assert want == (-1, np.inf)
        checked += 1
    assert found and found < checked  # both outcomes were exercised


def _full_run(ex, moves, cands, partners, eject, depth):
    """Exchange.run without the skip (every candidate's _move searched, beat = inf): the pre-142 loop."""
    ex.eject, made = eject, 0
    while made < moves and len(ex.bins) > 1:
        j = int(np.argmax(ex.t))
        docs = sorted((i for b in ex.bins[j] for i in b), key=lambda i: (-ex.work(j, i), i))[:cands]
        best = None
        for i in docs:
            mv = ex._move(j, i, depth, partners)
            if mv is not None and (best is None or mv[0] < best[0][0]):
                best = (mv, i)
        if best is None:
            break
        (_, acts), i = best
        ex.apply(j, i, acts)
        made += 1
    return made


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("depth", [1, 2])
def test_skipping_candidates_changes_no_move(seed, depth):
    _, l_, pipes, bins = _case(100 + seed)
    t0 = float(Exchange(l_, pipes, bins).t.max())
    ex, made = exchange(l_, pipes, bins, moves=12, cands=6, partners=8, eject=3, depth=depth)
    ref = Exchange(l_, pipes, bins)
    assert made == _full_run(ref, 12, 6, 8, 3, depth)
    assert ex.bins == ref.bins and ex.t.tolist() == ref.t.tolist() and ex.room.tolist() == ref.room.tolist()
    assert ex.valid() and float(ex.t.max()) <= t0
    assert ex.op.tolist() == np.where(ex.room == ex.m, ex.c, 0.0).tolist()  # op kept with room


def test_a_later_candidate_with_a_better_move_is_still_searched():
    # identical pipelines, time = tokens. P0 holds 50 and 40 (90); P1 45; P2 10. Moving the heavier 50 (searched
    # first) into P2 gives max(40, 60) = 60; the 40 leaves P0 at 50 < 60, so it is searched: into P2, max(50, 50) = 50.
    pipes = [PipeCost(0.0, 1.0, 0.0, 1, 1000)] * 3
    l_ = np.array([50, 40, 45, 10], dtype=np.int64)
    bins = [[[0, 1]], [[2]], [[3]]]
    ex = Exchange(l_, pipes, bins)
    ex.eject = 1
    assert ex._move(0, 0, 1, 2)[0] == 60.0 and ex._move(0, 1, 1, 2)[0] == 50.0
    assert ex._move(0, 1, 1, 2, beat=60.0)[0] == 50.0  # 50 without the 40 is under the best so far: searched
    assert ex._move(0, 1, 1, 2, beat=50.0) is None  # P0 without the 40 is 50: no move of it can be < 50
    got, made = exchange(l_, pipes, bins, moves=1, cands=2, partners=2, eject=1)
    assert made == 1 and float(got.t.max()) == 50.0 and got.bins == [[[0]], [[2]], [[3, 1]]]
