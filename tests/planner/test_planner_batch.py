"""Plan-time shortcuts that must not change a plan (issue 27, decision 138): Hydraulis Alg. 1 by pipeline classes
(alg1.alg1_trial_classes) makes alg1_trial's choices, and pack_groups' batched packing (kernels_batch.pack_many)
gives `pack`'s packings and floats, pipeline by pipeline; both compiled and as plain Python."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_synth import PROFILES, profile_steps

from tidal.planner import alg1, kernels, kernels_batch
from tidal.planner.alg1 import alg1_trial, alg1_trial_classes, class_layout, class_trial, dispatch_hydraulis
from tidal.planner.bounds import PipeCost
from tidal.planner.dispatch import dispatch
from tidal.planner.packing import pack
from tidal.planner.passes import pack_batch, pack_groups, pack_one

pytestmark = pytest.mark.unit

CLASSES = [pytest.param(alg1_trial_classes, id="plain"),
           pytest.param("compiled", id="compiled", marks=pytest.mark.skipif(not kernels.AVAILABLE,
                                                                            reason="numba is not installed"))]


def _classes(mode):
    return alg1.compiled(alg1_trial_classes) if mode == "compiled" else mode


def _tied_case(rng):
    """One-stage pipelines of a few classes with small round coefficients (many exact ties among the scores)."""
    kinds = int(rng.integers(1, 5))
    ka, kb = rng.choice([0.0, 1.0, 2.0, 0.5, 1e-3], kinds), rng.choice([0.0, 1.0, 3.0, 0.25], kinds)
    kc, km = rng.choice([0.0, 1.0, 0.5, 2.0], kinds), rng.integers(1, 60, kinds)
    k = rng.integers(0, kinds, int(rng.integers(1, 70)))
    A, B, C, M = ka[k].astype(float), kb[k].astype(float), kc[k].astype(float), km[k].astype(np.int64)
    l_ = rng.integers(1, int(M.max()) + 1, int(rng.integers(0, 90))).astype(np.int64)
    return l_, rng.permutation(l_.size), A, B, C, np.zeros(k.size), M


@pytest.mark.parametrize("mode", CLASSES)
def test_alg1_by_classes_makes_alg1s_choices(mode):
    """Owners and objective equal alg1_trial's exactly (ties broken alike), on random one-stage cases with exact
    ties, including sequences some classes cannot hold (objective -1 when none can)."""
    rng = np.random.default_rng(7)
    for _ in range(600):
        case = _tied_case(rng)
        ref = alg1_trial(*case)
        got = _classes(mode)(*case, *class_layout(*case[2:5], case[6]))
        assert got[1] == ref[1]
        if ref[1] >= 0:
            np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("mode", CLASSES)
def test_alg1_by_classes_on_many_pipelines(mode):
    """Larger: 120 pipelines of 3 classes with random coefficients, 1,200 sequences, and the default dispatch
    (which takes the class trial from CLASS_MIN pipelines) equal to alg1_trial's; a multi-stage pipeline sends the
    class trial to its fallback."""
    rng = np.random.default_rng(3)
    kinds = [PipeCost(*rng.uniform(1e-9, 1e-6, 1), *rng.uniform(1e-5, 1e-3, 1), *rng.uniform(1e-3, 1e-2, 1), 1,
                      int(m), float(rng.uniform(0, 1e-3))) for m in (4096, 8192, 32768)]
    pipes = [kinds[i] for i in rng.integers(0, 3, 120)]
    l_ = rng.integers(1, 4096, 1200)
    ref = dispatch_hydraulis(l_, pipes, trials=2, seed=1, trial=alg1_trial)
    assert dispatch_hydraulis(l_, pipes, trials=2, seed=1, trial=class_trial(_classes(mode), alg1_trial)) == ref
    assert len(pipes) >= alg1.CLASS_MIN and dispatch_hydraulis(l_, pipes, trials=2, seed=1) == ref
    multi = pipes[:-1] + [PipeCost(1e-7, 1e-4, 1e-3, 2, 32768)]
    calls = []

    def fallback(*a):
        calls.append(1)
        return (alg1.compiled(alg1_trial) or alg1_trial)(*a)
    got = dispatch_hydraulis(l_, multi, trials=1, seed=1, trial=class_trial(_classes(mode), fallback))
    assert calls and got == dispatch_hydraulis(l_, multi, trials=1, seed=1, trial=alg1_trial)


BATCH = [pytest.param("PLAIN", id="plain"),
         pytest.param("COMPILED", id="compiled", marks=pytest.mark.skipif(kernels_batch.COMPILED is None,
                                                                         reason="numba is not installed"))]


@pytest.mark.parametrize("mode", BATCH)
def test_pack_many_is_pack_on_each_group(mode):
    """kernels_batch.pack_many on concatenated groups: each group's packing, micro-batch ends and time are those
    `pack` returns for that group alone (>= 2 sequences; multi-stage and one-stage costs)."""
    from tidal.planner.bounds import PipeCost as P

    rng = np.random.default_rng(11)
    loops = getattr(kernels_batch, mode)
    kinds = [P(1e-3, 1.0, 0.5, 1, 64), P(0.5e-3, 0.5, 0.5, 2, 128), P(2e-4, 0.25, 1.0, 4, 200),
             P(3e-4, 0.2, 0.2, 1, 256, 0.7), P(1e-4, 0.3, 0.0, 2, 150, 2.0)]
    for _ in range(60):
        pipes = [kinds[i] for i in rng.integers(0, len(kinds), int(rng.integers(1, 12)))]
        subs = [rng.integers(1, p.max_len + 1, int(rng.integers(2, 40))).astype(np.int64) for p in pipes]
        bounds = np.concatenate(([0], np.cumsum([s.size for s in subs]))).astype(np.int64)
        S = np.array([int(s.sum()) for s in subs], dtype=np.int64)
        su = np.array([int(int(x) // p.coeffs.util_len()) for x, p in zip(S, pipes)], dtype=np.int64)
        arr = {k: np.array([getattr(p, k) for p in pipes], dtype=np.float64) for k in ("a", "b", "c", "d", "q")}
        ol, mb, nmb, est, _ = loops.pack_many(np.concatenate(subs), bounds, arr["a"], arr["b"], arr["d"], arr["c"],
                                              arr["q"], np.array([p.max_len for p in pipes]), S, su)
        for g, (p, sub) in enumerate(zip(pipes, subs)):
            ref = pack(sub, p.coeffs, p.pp, p.max_len)
            o = ol[bounds[g]:bounds[g + 1]].tolist()
            ends = mb[bounds[g]:bounds[g] + nmb[g]].tolist()
            assert tuple(tuple(o[x:y]) for x, y in zip([0] + ends[:-1], ends)) == ref.micro_batches
            assert float(est[g]) == ref.est_time


@settings(max_examples=60, deadline=None)
@given(profile_steps(), st.integers(0, 3), st.floats(0.3, 1.2))
def test_pack_groups_batched_equals_one_by_one(case, seed, frac):
    """pack_groups with `pack` (batched) gives the plans of packing each pipeline on its own (pack_one), and with a
    finite limit (chunks, given up early) the same answer as the one-by-one loop."""
    prof, l_ = case
    disp = dispatch(l_, prof.pipes, seed=seed)
    lf = l_.astype(np.float64)
    one = [pack_one(l_, lf, prof, disp.groups, pack, False, j) for j in range(len(prof.pipes))]
    done = pack_batch(l_, lf, prof, disp.groups, range(len(prof.pipes)))
    assert done == dict(enumerate(one))
    est, plans = pack_groups(l_, prof, disp.groups, pack, False)
    assert [(p.micro_batches, p.est_time) for p in plans] == one and est == max(t for _, t in one)
    limit = est * frac
    order = list(range(len(prof.pipes)))[::-1]
    want = next((True for j in order if one[j][1] >= limit), False)
    got = pack_groups(l_, prof, disp.groups, pack, False, limit=limit, order=order)
    assert (got == (float("inf"), ())) == want


def test_profiles_cover_multi_micro_batch_packings():
    """The property test above reaches the batched path (a pipeline packed into >= 2 micro-batches)."""
    l_ = np.full(40, 60, dtype=np.int64)
    prof = PROFILES[3]
    disp = dispatch(l_, prof.pipes, seed=0)
    done = pack_batch(l_, l_.astype(np.float64), prof, disp.groups, range(len(prof.pipes)))
    assert any(len(mbs) >= 2 for mbs, _ in done.values())


@settings(max_examples=80, deadline=None)
@given(profile_steps(), st.integers(0, 3))
def test_exchange_sums_are_its_own_times(case, seed):
    """exchange.Exchange's tokens, times and rooms at the start (kernels_sums.mb_works by coefficient group) equal
    what it recomputes for one pipeline after a move (Exchange._time: np.sum of the pipeline's work; _room), float for
    float, with and without empty pipelines."""
    from tidal.planner.exchange import Exchange

    prof, l_ = case
    disp = dispatch(l_, prof.pipes, seed=seed)
    _, plans = pack_groups(l_, prof, disp.groups, pack, False)
    bins = [[list(mb) for mb in p.micro_batches] for p in plans]
    ex = Exchange(l_, prof.pipes, bins)
    assert ex.t.tolist() == [ex._time(j) for j in range(len(bins))]
    assert ex.tok == [[int(l_[b].sum()) for b in bs] for bs in ex.bins]
    assert ex.room.tolist() == [ex._room(j) for j in range(len(bins))]
    empty = Exchange(l_, prof.pipes, [[] for _ in bins[:-1]] + [[list(range(l_.size))]])
    assert empty.t.tolist() == [empty._time(j) for j in range(len(bins))]
    assert empty.room.tolist() == [empty._room(j) for j in range(len(bins))]
