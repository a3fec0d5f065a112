"""benchmarks/gap_trim.py (decision 131): its subset sum is exact, its packings hold every document once within
MaxLen, its check refuses a broken plan, and its repair returns a real plan never slower than the one it was given
and never faster than the least packed step time (brute force on small steps)."""

import itertools

import numpy as np
import pytest

from _packed_brute import bench_module, small_steps, three_pipes  # isort: skip

from tidal.planner.bounds import PipeCost
from tidal.proof.binpack import l2_bins


@pytest.fixture(scope="module")
def gt():
    return bench_module("gap_trim")


def test_best_subset_is_the_largest_sum_under_the_room(gt):
    rng = np.random.default_rng(3)
    for _ in range(200):
        xs = [int(x) for x in rng.integers(1, 30, size=int(rng.integers(0, 9)))]
        room = int(rng.integers(0, 80))
        got = gt.best_subset(xs, room)
        assert len(set(got)) == len(got) and sum(xs[k] for k in got) <= room
        best = max(sum(c) for r in range(len(xs) + 1) for c in itertools.combinations(xs, r) if sum(c) <= room)
        assert sum(xs[k] for k in got) == best, (xs, room)


def test_mbs_pack_holds_every_document_once_within_maxlen(gt):
    rng = np.random.default_rng(5)
    for _ in range(100):
        l_ = rng.integers(1, 40, size=int(rng.integers(1, 30))).astype(np.int64)
        cap = int(rng.integers(40, 90))
        docs = list(range(l_.size))
        bins = gt.mbs_pack(l_, docs, cap, l_.size)
        assert bins is not None and sorted(i for b in bins for i in b) == docs
        assert all(b and int(l_[b].sum()) <= cap for b in bins) and len(bins) >= l2_bins(l_, cap)
        assert gt.mbs_pack(l_, docs, cap, len(bins) - 1) is None  # the count it needs is the count it reports


def test_check_refuses_a_lost_or_repeated_document_and_an_overfull_micro_batch(gt):
    l_ = np.array([5, 6, 7], dtype=np.int64)
    pipes = [PipeCost(1e-4, 0.01, 0.05, 1, 12), PipeCost(1e-4, 0.01, 0.05, 1, 12)]
    assert gt.Trim(l_, pipes, [[[0, 1]], [[2]]]).check() > 0
    for bad, says in (([[[0, 1]], [[1]]], "exactly once"), ([[[0]], [[1, 2]]], "over MaxLen")):
        with pytest.raises(ValueError, match=says):
            gt.Trim(l_, pipes, bad).check()


def test_trim_returns_a_real_plan_between_the_optimum_and_the_plan_it_was_given(gt):
    pipes = three_pipes()
    for l_, best in small_steps(11, 6, 7, pipes):
        plan = [[[i] for i in range(j, l_.size, 3)] for j in range(3)]  # round robin, one document a micro-batch
        given = gt.Trim(l_, pipes, plan).check()
        for repack_tries in (0, 4):
            tr, got, *_ = gt.trim(l_, pipes, plan, excess=1.0, repack_tries=repack_tries)
            assert tr.check() == got  # every document once, every micro-batch within MaxLen
            assert best * (1 - 1e-9) <= got <= given * (1 + 1e-12)
