"""benchmarks/gap_forced.py (decision 149): the forced-documents-first dispatch is a dispatch (each document once,
none over its pipeline's MaxLen), keeps every forced document's pipeline within T, and refuses a T that the longest
document alone exceeds."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tidal.planner.bounds import PipeCost

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gap_forced import RULES, forced_first  # noqa: E402

# a mixed one-stage candidate in miniature: 2 long-MaxLen pipelines, 6 short ones (MaxLen 1,000)
PIPES = [PipeCost(2e-9, 1e-5, 0.01, 1, 8000)] * 2 + [PipeCost(4e-9, 2e-5, 0.005, 1, 1000)] * 6


def relaxed(pipes, l_, groups):
    return [0.0 if not g else max(1, -(-int(l_[g].sum()) // p.max_len)) * p.c + float(p.work(l_[g]).sum())
            for p, g in zip(pipes, groups)]


@pytest.mark.parametrize("rule", RULES)
def test_forced_first_is_a_dispatch_within_t_for_its_forced_documents(rule):
    rng = np.random.default_rng(7)
    l_ = np.concatenate([rng.integers(1500, 4000, 5), rng.integers(20, 900, 120)]).astype(np.int64)
    T = 0.2
    groups = forced_first(l_, PIPES, T, rule)
    assert groups is not None
    got = np.sort(np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]))
    assert np.array_equal(got, np.arange(l_.size))
    assert all(not g or int(l_[g].max()) <= p.max_len for g, p in zip(groups, PIPES))
    t = relaxed(PIPES, l_, groups)
    long_ = set(np.flatnonzero(l_ > 1000).tolist())
    assert long_ and all(j < 2 for j, g in enumerate(groups) if long_ & set(g))  # only the long-MaxLen kind holds them
    only = forced_first(l_, PIPES, T, rule, forced_only=True)
    assert sorted(i for g in only for i in g) == sorted(long_)
    assert max(relaxed(PIPES, l_, only)) <= T
    assert max(t) >= max(relaxed(PIPES, l_, only))


def test_forced_first_refuses_a_target_under_the_longest_document():
    l_ = np.array([5000, 3000, 200, 100], dtype=np.int64)
    alone = PIPES[0].c + PIPES[0].w1(5000.0)
    assert forced_first(l_, PIPES, alone * 1.01, "bf") is not None
    assert forced_first(l_, PIPES, alone * 0.99, "bf") is None


def test_the_compiled_fill_matches_the_python_one():
    from gap_forced import FILL, lpt_fill

    rng = np.random.default_rng(3)
    l_ = rng.integers(1, 7000, 400).astype(np.int64)
    M = np.array([p.max_len for p in PIPES], dtype=np.int64)
    c = np.array([p.c for p in PIPES])
    coef = np.array([[p.a, p.b, p.d] for p in PIPES])
    rest = np.argsort(-l_, kind="stable").astype(np.int64)
    outs = []
    for f in (FILL, lpt_fill):
        tok, w, owner = np.zeros(M.size, dtype=np.int64), np.zeros(M.size), np.full(l_.size, -1, dtype=np.int64)
        f(rest, l_, M, c, coef, tok, w, owner)
        outs.append((owner, tok, w))
    assert (outs[0][0] >= 0).all() and all(M[outs[0][0]] >= l_)
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    assert np.array_equal(outs[0][2], outs[1][2])
