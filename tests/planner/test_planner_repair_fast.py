"""The repair's rebalance searches in compiled loops (kernels_batch.rebal_move, rebal_swap; issue 27, decision 146)
are numpy's (repair.Repair.rebalance before decision 146, written out here): the same value and pick, float for
float, on states with many ties and on states where nothing fits, compiled and as plain Python; and the repair of
random plans is the same with the compiled and the plain loops."""

import json

import numpy as np
import pytest

from tidal.planner import kernels, kernels_batch, repair
from tidal.planner.bounds import PipeCost

pytestmark = pytest.mark.unit

LOOPS = [kernels_batch.PLAIN] + ([kernels_batch.COMPILED] if kernels.AVAILABLE else [])


def _moves_numpy(t, w, l_, c, j, ij, aj, room, extra):
    """Repair.rebalance's move search before decision 146: (value, pipeline, position) of numpy's argmin."""
    P = t.size
    single = np.bincount(aj)[aj] == 1
    out_j = t[j] - w[j, ij] - np.where(single, c[j], 0.0)
    others = np.delete(np.arange(P), j)
    new = np.maximum(out_j[None, :], (t[others] + extra[others])[:, None] + w[np.ix_(others, ij)])
    new[l_[ij][None, :] > room[others][:, None]] = np.inf
    r, x = divmod(int(np.argmin(new)), ij.size)
    return float(new[r, x]), int(others[r]), x


def _swaps_numpy(t, w, l_, j, ij, aj, fj, K, po, fk):
    """Its swap search before decision 146: (value, row, column) of numpy's argmin."""
    dl = l_[K][None, :] - l_[ij][:, None]
    ok = (dl <= fj[aj][:, None]) & (-dl <= fk[None, :]) & (dl != 0)
    tj = (t[j] - w[j, ij])[:, None] + w[j, K][None, :]
    to = (t[po] - w[po, K])[None, :] + w[po[None, :], ij[:, None]]
    new2 = np.where(ok, np.maximum(tj, to), np.inf)
    r, x = divmod(int(np.argmin(new2)), K.size)
    return float(new2[r, x]), r, x


@pytest.mark.parametrize("seed", range(5))
def test_rebal_move_and_swap_are_numpys(seed):
    rng = np.random.default_rng(seed)
    seen = {"move": 0, "none": 0, "swap": 0, "noswap": 0}
    for _ in range(150):
        P, n = int(rng.integers(2, 9)), int(rng.integers(1, 30))
        l_ = rng.choice([4, 8, 16, 24, 32], n).astype(np.int64)
        w = rng.choice([0.25, 0.5, 1.0, 2.0], (P, n)) * rng.choice([1.0, 1e-3])  # round values: many exact ties
        c = rng.choice([0.0, 0.5, 1.0], P)
        t = rng.choice([1.0, 2.0, 3.0, 4.0], P) * rng.choice([1.0, 1e-3])
        room = rng.choice([0, 4, 8, 16, 32], P).astype(np.int64)  # 0: nothing fits there
        extra = np.where(rng.random(P) < 0.3, c, 0.0)
        j = int(rng.integers(0, P))
        m = int(rng.integers(1, n + 1))
        ij = rng.choice(n, m, replace=False).astype(np.int64)
        aj = rng.integers(0, 3, m).astype(np.int64)
        fj = rng.integers(0, 20, 3).astype(np.int64)
        k = int(rng.integers(0, n + 1))
        K = rng.choice(n, k, replace=False).astype(np.int64)
        po = np.array([o for o in rng.integers(0, P, k) if o != j] or [0], dtype=np.int64)[:k]
        K, fk = K[:po.size], rng.integers(0, 20, po.size).astype(np.int64)
        if po.size and (po == j).any():
            continue
        want = _moves_numpy(t, w, l_, c, j, ij, aj, room, extra)
        for lp in LOOPS:
            v, o, x = lp.rebal_move(t, w, l_, c, j, ij, aj, room, extra)
            if want[0] == np.inf:  # nothing fits: the caller only reads the value
                assert v == np.inf and o == -1
            else:
                assert (float(v), int(o), int(x)) == want
        seen["move" if want[0] < np.inf else "none"] += 1
        if K.size:
            want = _swaps_numpy(t, w, l_, j, ij, aj, fj, K, po, fk)
            for lp in LOOPS:
                v, r, x = lp.rebal_swap(t, w, l_, j, ij, aj, fj, K, po, fk)
                assert float(v) == want[0] and (want[0] == np.inf or (int(r), int(x)) == want[1:])
            seen["swap" if want[0] < np.inf else "noswap"] += 1
    assert all(seen.values()), seen


@pytest.mark.parametrize("seed", range(6))
def test_repair_plain_and_compiled_loops_agree(seed, monkeypatch):
    """Random one-stage plans (three pipeline classes, round coefficients) repaired with the compiled loops and with
    the plain ones: the same micro-batches and counts."""
    rng = np.random.default_rng(50 + seed)
    kinds = [PipeCost(0.0, 1.0, 2.0, 1, 64), PipeCost(0.0, 0.5, 1.0, 1, 128), PipeCost(1 / 64, 0.25, 1.0, 1, 256)]
    pipes = [kinds[int(k)] for k in rng.integers(0, 3, 12)]
    l_ = rng.choice([4, 8, 12, 16, 24, 32, 48, 64], 150).astype(np.int64)
    bins = [[] for _ in pipes]
    for i, x in enumerate(l_.tolist()):  # first fit on a random pipeline: loose packings, so repacks happen
        j = int(rng.choice([j for j, p in enumerate(pipes) if x <= p.max_len]))
        b = next((b for b in bins[j] if int(l_[b].sum()) + x <= pipes[j].max_len // 2), None)
        bins[j].append([i]) if b is None else b.append(i)

    def run():
        rp, *counts = repair.repair(l_, pipes, bins)
        return json.dumps([None if rp is None else rp.bins, counts])

    want = run()
    assert json.loads(want)[0] is not None  # it repacked, so the rebalance ran
    monkeypatch.setattr(kernels_batch, "loops", lambda: kernels_batch.PLAIN)
    assert run() == want
