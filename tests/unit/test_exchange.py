"""planner/exchange.py (decision 136): its compound moves keep every document once within MaxLen, never slow the plan
they were given, never beat the least packed step time (brute force on small steps), time pipelines as the packer
does, and find a move on an instance where no single move or swap lowers the step time."""

import itertools

import numpy as np

from _packed_brute import small_steps, three_pipes  # isort: skip
from _plan_cases import random_plan  # isort: skip

from tidal.planner.bounds import PipeCost
from tidal.planner.exchange import Exchange, exchange
from tidal.planner.packing import pipeline_time


def _checked_max(l_, pipes, ex) -> float:
    assert ex.valid()
    assert sorted(i for bs in ex.bins for b in bs for i in b) == list(range(l_.size))
    lf = l_.astype(np.float64)
    times = [pipeline_time(lf, bs, p.coeffs, p.pp) for bs, p in zip(ex.bins, pipes)]
    assert np.allclose(times, ex.t, rtol=1e-12, atol=1e-12)  # its sums are the packer's times
    return max(times)


def test_exchange_returns_a_real_plan_between_the_optimum_and_the_plan_it_was_given():
    pipes = three_pipes()
    rng = np.random.default_rng(11)
    moved = 0
    for l_, opt in small_steps(4, 30, 5, pipes):
        start = random_plan(rng, l_, pipes)
        before = Exchange(l_, pipes, start)
        t0 = float(before.t.max())
        for depth in (1, 2):
            ex, made = exchange(l_, pipes, start, moves=8, cands=4, partners=3, eject=3, depth=depth)
            got = _checked_max(l_, pipes, ex)
            assert got <= t0 * (1 + 1e-12) and got >= opt * (1 - 1e-9)
            if not made:  # no move: the plan it was given
                assert ex.bins == [[b for b in bs if b] for bs in start]
            moved += made
    assert moved > 0  # the random plans leave room to move


def _single_moves_and_swaps(l_, pipes, bins) -> float:
    """The least step time over every single move (into any micro-batch with room, or a new one) and every swap of
    two documents of different pipelines (both micro-batches within MaxLen)."""
    base = Exchange(l_, pipes, bins)
    best = float(base.t.max())
    loc = {i: (j, k) for j, bs in enumerate(bins) for k, b in enumerate(bs) for i in b}

    def time_of(new):
        ex = Exchange(l_, pipes, new)
        return float(ex.t.max()) if ex.valid() else np.inf

    for i, (j, k) in loc.items():
        for o in range(len(pipes)):
            for kk in range(len(bins[o]) + 1):
                if o == j:
                    continue
                new = [[list(b) for b in bs] for bs in bins]
                new[j][k].remove(i)
                if kk == len(new[o]):
                    new[o].append([])
                new[o][kk].append(i)
                new[j] = [b for b in new[j] if b]
                best = min(best, time_of(new))
    for (i, (j, k)), (x, (o, kk)) in itertools.combinations(loc.items(), 2):
        if j != o:
            new = [[list(b) for b in bs] for bs in bins]
            new[j][k][new[j][k].index(i)], new[o][kk][new[o][kk].index(x)] = x, i
            best = min(best, time_of(new))
    return best


def test_a_compound_move_helps_where_no_single_move_or_swap_does():
    # P0 holds one 5-token document alone (twice the per-token cost: 10.1); P1 holds four of 2 tokens (8.1), P2 one
    # (MaxLen 4: it cannot take the 5). Moving the 5 into P1 needs two of its documents out (one is not enough), so
    # no single move or swap helps; the compound move gives 9.1.
    pipes = [PipeCost(0.0, 2.0, 0.1, 1, 5), PipeCost(0.0, 1.0, 0.1, 1, 100), PipeCost(0.0, 1.0, 0.1, 1, 4)]
    l_ = np.array([5, 2, 2, 2, 2, 1], dtype=np.int64)
    bins = [[[0]], [[1, 2, 3, 4]], [[5]]]
    t0 = float(Exchange(l_, pipes, bins).t.max())
    assert abs(t0 - 10.1) < 1e-9 and _single_moves_and_swaps(l_, pipes, bins) == t0
    ex, made = exchange(l_, pipes, bins, moves=1, eject=3, depth=1)
    assert made == 1 and abs(_checked_max(l_, pipes, ex) - 9.1) < 1e-9
    assert exchange(l_, pipes, bins, moves=1, eject=1, depth=1)[1] == 0  # one ejected document is not enough
