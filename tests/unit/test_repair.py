"""planner/repair.py (decisions 131, 134): its subset sum is exact, its packings hold every document once within
MaxLen, its check refuses a broken plan, and its repair returns a real plan never slower than the one it was given
and never faster than the least packed step time (brute force on small steps); benchmarks/gap_trim.py runs it."""

import itertools

import numpy as np
import pytest

from _packed_brute import bench_module, least_packed_time, small_steps, three_pipes  # isort: skip

from tidal.planner.bounds import PipeCost
from tidal.planner.repair import Repair, best_subset, mbs_pack, repair
from tidal.proof.binpack import l2_bins


def test_best_subset_is_the_largest_sum_under_the_room():
    rng = np.random.default_rng(3)
    for _ in range(200):
        xs = [int(x) for x in rng.integers(1, 30, size=int(rng.integers(0, 9)))]
        room = int(rng.integers(0, 80))
        got = best_subset(xs, room)
        assert len(set(got)) == len(got) and sum(xs[k] for k in got) <= room
        best = max(sum(c) for r in range(len(xs) + 1) for c in itertools.combinations(xs, r) if sum(c) <= room)
        assert sum(xs[k] for k in got) == best, (xs, room)


def test_mbs_pack_holds_every_document_once_within_maxlen():
    rng = np.random.default_rng(5)
    for _ in range(100):
        l_ = rng.integers(1, 40, size=int(rng.integers(1, 30))).astype(np.int64)
        cap = int(rng.integers(40, 90))
        docs = list(range(l_.size))
        bins = mbs_pack(l_, docs, cap, l_.size)
        assert bins is not None and sorted(i for b in bins for i in b) == docs
        assert all(b and int(l_[b].sum()) <= cap for b in bins) and len(bins) >= l2_bins(l_, cap)
        assert mbs_pack(l_, docs, cap, len(bins) - 1) is None  # the count it needs is the count it reports


def test_valid_refuses_a_lost_or_repeated_document_and_an_overfull_micro_batch():
    l_ = np.array([5, 6, 7], dtype=np.int64)
    pipes = [PipeCost(1e-4, 0.01, 0.05, 1, 12), PipeCost(1e-4, 0.01, 0.05, 1, 12)]
    gt = bench_module("gap_trim")
    assert Repair(l_, pipes, [[[0, 1]], [[2]]]).valid() and gt.check(Repair(l_, pipes, [[[0, 1]], [[2]]])) > 0
    for bad in ([[[0, 1]], [[1]]], [[[0]], [[1, 2]]], [[[0, 1]], []]):
        assert not Repair(l_, pipes, bad).valid()
        with pytest.raises(ValueError, match="MaxLen"):
            gt.check(Repair(l_, pipes, bad))


def _random_plan(rng, l_, pipes):
    """Each document on a random pipeline that holds it, one micro-batch each: a valid, slow plan."""
    bins = [[] for _ in pipes]
    for i, x in enumerate(l_.tolist()):
        ok = [j for j, p in enumerate(pipes) if x <= p.max_len]
        bins[int(rng.choice(ok))].append([i])
    return bins


def test_repair_returns_a_real_plan_between_the_optimum_and_the_plan_it_was_given():
    pipes = three_pipes()
    rng = np.random.default_rng(11)
    gains = 0
    for l_, best in small_steps(11, 6, 7, pipes):
        for plan in ([[[i] for i in range(j, l_.size, 3)] for j in range(3)], _random_plan(rng, l_, pipes)):
            given = float(Repair(l_, pipes, plan).times().max())
            for kw in ({}, dict(excess=0.9, drops=0, partners=1), dict(rounds=0, moves=0)):
                rp, repacked, dropped, made = repair(l_, pipes, plan, **kw)
                if rp is None:  # stops when nothing repacks
                    assert repacked == dropped == made == 0
                    continue
                got = float(rp.times().max())
                assert rp.valid() and repacked >= 1  # every document once, every micro-batch non-empty within MaxLen
                assert best * (1 - 1e-9) <= got <= given * (1 + 1e-12)
                gains += got < given * (1 - 1e-9)
    assert gains > 0  # the repair does something on these steps


def test_repair_drop_reaches_the_optimum_where_one_micro_batch_holds_a_few_tokens():
    """Two equal pipelines (MaxLen 20): 21 tokens on one, packed 4 + 17 | ... ; the repacked plan moves the 1-token
    excess to the other pipeline and drops a micro-batch (the decision 129 pattern at toy size)."""
    pipes = [PipeCost(1e-4, 0.01, 0.5, 1, 20), PipeCost(1e-4, 0.01, 0.5, 1, 20)]
    l_ = np.array([10, 10, 1, 12, 3], dtype=np.int64)
    plan = [[[0], [1], [2]], [[3], [4]]]  # 21 tokens in 3 micro-batches, 15 in 2
    rp, repacked, dropped, _ = repair(l_, pipes, plan, excess=0.1)
    assert rp.valid() and repacked >= 1 and [len(b) for b in rp.bins] == [1, 1]
    assert float(rp.times().max()) == pytest.approx(least_packed_time(l_, pipes), rel=1e-12)
