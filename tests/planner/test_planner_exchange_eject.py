"""The exchange's ejection pick in one loop (kernels_batch.eject_pick, issue 27, decision 143) is numpy's
(`_numpy_pick`, Exchange._eject's pick before it): the same documents, or None, on plans of many ties, compiled and
as plain Python, also on unsorted prefix sums (the compiled np.searchsorted gives numpy's index there too)."""

import numpy as np
import pytest

from tidal.planner import kernels, kernels_batch
from tidal.planner.bounds import PipeCost
from tidal.planner.exchange import Exchange

pytestmark = pytest.mark.unit


def _case(seed, n=16, docs=120):
    """Pipelines of three classes with round coefficients (many ties), each document first-fit on a random one."""
    rng = np.random.default_rng(seed)
    kinds = [PipeCost(0.0, 1.0, 2.0, 1, 64), PipeCost(0.0, 0.5, 1.0, 1, 128), PipeCost(1 / 64, 0.25, 1.0, 1, 256)]
    pipes = [kinds[int(k)] for k in rng.integers(0, 3, n)]
    l_ = rng.choice([4, 8, 16, 24, 32, 48, 64], docs).astype(np.int64)
    bins = [[] for _ in pipes]
    for i, x in enumerate(l_.tolist()):
        j = int(rng.choice([j for j, p in enumerate(pipes) if x <= p.max_len]))
        b = next((b for b in bins[j] if int(l_[b].sum()) + x <= pipes[j].max_len), None)
        bins[j].append([i]) if b is None else b.append(i)
    return rng, l_, Exchange(l_, pipes, bins)


def _numpy_pick(ln, kk, w, k, need_tok, need_w, eject):
    """Exchange._eject's pick as numpy expressions (before decision 143): positions into the sorted documents, or
    None."""
    ok = (w > need_w) & (kk == k) & (ln >= need_tok) if need_tok > 0 else w > need_w
    if ok.any():
        return [int(np.flatnonzero(ok)[0])]
    take, wsum = np.zeros(0, dtype=np.int64), 0.0
    if need_tok > 0:
        ink = np.flatnonzero(kk == k)
        m = int(np.searchsorted(np.cumsum(ln[ink]), need_tok)) + 1
        if m > min(ink.size, eject):
            return None
        take = ink[:m]
        wsum = float(w[take].sum())
    if not wsum > need_w:
        rest = np.setdiff1d(np.arange(ln.size), take)
        cum = np.cumsum(np.concatenate(([wsum], w[rest])))[1:]
        m = int(np.searchsorted(cum, need_w, side="right")) + 1
        if m > rest.size:
            return None
        take = np.concatenate([take, rest[:m]])
    return take.tolist() if take.size <= eject else None


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("eject", [1, 3, 6])
def test_eject_pick_is_numpys_compiled_and_plain(seed, eject):
    rng, l_, ex = _case(seed)
    ex.eject = eject
    plain = kernels_batch.PLAIN.eject_pick
    seen = {"none": 0, "empty": 0, "one": 0, "more": 0}
    for _ in range(400):
        q = int(rng.integers(0, len(ex.bins)))
        if not ex.bins[q]:
            continue
        k = int(rng.integers(0, len(ex.bins[q])))
        i = int(rng.integers(0, l_.size))
        limit = float(ex.t[q]) * float(rng.choice([0.3, 0.6, 0.8, 0.95, 1.0, 1.2]))
        want = ex._eject(q, k, i, limit)  # kernels_batch.loops(): compiled where numba is installed
        need_tok = ex.tok[q][k] + int(l_[i]) - int(ex.m[q])
        need_w = float(ex.t[q] + ex.work(q, i) - limit)
        if want != []:  # _eject's own shortcut returned [] before the pick
            ids, ln, kk, w = ex._docs(q)
            ref = _numpy_pick(ln, kk, w, k, need_tok, need_w, eject)
            assert (None if ref is None else ids[ref].tolist()) == want
            found, take = plain(ln, kk, w, k, need_tok, need_w, eject)
            assert (ids[take].tolist() if found else None) == want
        seen["none" if want is None else "empty" if not want else "one" if len(want) == 1 else "more"] += 1
    assert seen["none"] and seen["empty"] and seen["one"], seen  # every outcome exercised
    assert seen["more"] or eject == 1, seen


@pytest.mark.parametrize("seed", range(4))
def test_eject_pick_on_unsorted_and_negative_works(seed):
    """Arbitrary lengths, micro-batches and works (negative ones too: sums not monotone): plain and compiled agree
    with the numpy expression of Exchange._eject, float for float."""
    rng = np.random.default_rng(100 + seed)
    loops = [kernels_batch.PLAIN] + ([kernels_batch.COMPILED] if kernels.AVAILABLE else [])
    for _ in range(300):
        n = int(rng.integers(0, 9))
        ln = rng.integers(1, 40, n).astype(np.int64)
        kk = rng.integers(0, 3, n).astype(np.int64)
        w = rng.normal(0.5, 1.0, n) * rng.choice([1e-3, 1.0, 1e3])
        k, eject = int(rng.integers(0, 3)), int(rng.integers(1, 5))
        need_tok, need_w = int(rng.integers(-5, 60)), float(rng.normal(0.5, 2.0))
        want = _numpy_pick(ln, kk, w, k, need_tok, need_w, eject)
        for lp in loops:
            found, got = lp.eject_pick(ln, kk, w, k, need_tok, need_w, eject)
            assert (got.tolist() if found else None) == want
