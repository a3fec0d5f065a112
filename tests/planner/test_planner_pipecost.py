"""The pipeline cost formula has one source (planner/pipecost.py, decisions 85 and 96): its plain-Python functions and
their numba compilation (kernels.compile_pipecost) give the same floats on seeded random inputs, the dispatch's loads
(kernels.pipe_loads) are pipecost.cost1 compiled and plain, best_v is the minimum over every V (convexity), and one
stage (q = 0) is priced at the sum of its micro-batches, V c + W (decision 94)."""

import numpy as np
import pytest
from planner_synth import formula_cases

from tidal.planner import pipecost

pytestmark = pytest.mark.unit


def test_best_v_is_the_minimum_over_every_v():
    for q, c, M, W, tok, wm, cnt, _ in formula_cases(300, 0):
        vmin = max(1, -(-tok // M))
        vmax = max(vmin, cnt)
        v, val = pipecost.best_v(q, c, W, wm, vmin, vmax)
        every = [pipecost.pipe_value(q, c, W, wm, x) for x in range(vmin, vmax + 1)]
        assert vmin <= v <= vmax and val == pipecost.pipe_value(q, c, W, wm, v)
        assert val <= min(every) * (1 + 1e-12)


def test_compiled_and_plain_python_give_the_same_floats():
    pytest.importorskip("numba")  # in the dev extra: CI runs both modes
    from tidal.planner import kernels

    jit = kernels.compile_pipecost()
    for q, c, M, W, tok, wm, cnt, g in formula_cases(400, 1):
        vmin = max(1, -(-tok // M))
        vmax = max(vmin, cnt)
        for name, args in [("pipe_value", (q, c, W, wm, vmin)), ("v_opt", (q, c, W, wm)),
                           ("packed_value", (q, c, W, c + wm, vmin)),
                           ("best_v", (q, c, W, wm, vmin, vmax)), ("bound_value", (q, c, M, W, tok, wm, cnt)),
                           ("greedy_cost", (q, c, M, W, tok, wm, cnt, g)),
                           ("add_cost", (c, q, M, W, tok, wm, cnt, g, M // 3, wm / 2, False)),
                           ("add_cost", (c, q, M, W, tok, wm / 2, cnt, g, 2 * M // 3, wm, True))]:
            assert jit[name](*args) == getattr(pipecost, name)(*args), (name, args)


def test_dispatch_loads_are_cost1():
    """kernels.pipe_loads (the dispatch's per-pipeline loads) compiled and as plain Python against pipecost.cost1."""
    from tidal.planner import kernels

    rng = np.random.default_rng(2)
    n = 500
    A = rng.lognormal(-20, 1, n) * (rng.random(n) < 0.9)
    B = rng.lognormal(-10, 1, n)
    C = np.where(rng.random(n) < 0.15, 0.0, rng.lognormal(-2, 1, n))
    Dd = rng.lognormal(-8, 1, n)
    Q1 = rng.integers(0, 8, n).astype(np.float64)
    Q1[rng.random(n) < 0.1] = pipecost.EQ1_Q  # one-stage pipelines priced by Hydraulis Eq. 1 (decision 97)
    M = rng.integers(256, 65536, n).astype(np.float64)
    R = np.sqrt(Q1 / np.where(C > 0, C, 1e-300)).clip(max=1e150)
    N = np.where(rng.random(n) < 0.1, 0.0, rng.integers(1, 400, n).astype(np.float64))
    lmax = np.floor(rng.uniform(0.05, 1, n) * M)
    S = np.where(N > 0, np.minimum(N * lmax, rng.uniform(1, 40, n) * M), 0.0)
    Q = S * lmax * rng.uniform(0.1, 1, n)
    G = rng.integers(0, 4, n).astype(np.float64)
    want = np.array([pipecost.cost1(A[j], B[j], C[j], Dd[j], Q1[j], M[j], R[j], Q[j], S[j], N[j], lmax[j], G[j])
                     for j in range(n)])
    for loops in (kernels.PLAIN, kernels.COMPILED):
        if loops is None:  # pragma: no cover - numba not installed
            continue
        load = np.zeros(n)
        loops.pipe_loads(A, B, C, Dd, Q1, M, R, Q, S, N, lmax, G, load)
        np.testing.assert_array_equal(load, want)


def test_cost1_floor_is_below_cost1_and_tight():
    """pipecost.cost1_floor (the local search skips cost1 where it cannot beat the best move, decision 107) is at most
    cost1's float value on random pipelines (q = 0, Eq. 1's q, c = 0, long documents, huge and tiny sums), compiled
    and plain, and within a few per cent of it on most (else it would prune nothing)."""
    rng = np.random.default_rng(5)
    n = 6000
    A = rng.lognormal(-20, 2, n) * (rng.random(n) < 0.9)
    B = rng.lognormal(-10, 2, n)
    C = np.where(rng.random(n) < 0.1, 0.0, rng.lognormal(-2, 2, n))
    Dd = rng.lognormal(-8, 1, n) * (rng.random(n) < 0.7)
    Q1 = rng.integers(0, 8, n).astype(np.float64)
    Q1[rng.random(n) < 0.1] = pipecost.EQ1_Q
    M = rng.integers(256, 65536, n).astype(np.float64)
    R = np.sqrt(Q1 / np.where(C > 0, C, 1e-300)).clip(max=1e150)
    N = rng.integers(1, 400, n).astype(np.float64)
    lmax = np.maximum(1.0, np.floor(rng.uniform(0.0, 1, n) ** 3 * M))
    S = np.maximum(lmax, np.minimum(N * lmax, rng.uniform(0.01, 40, n) * M))
    Q = np.maximum(lmax * lmax, S * lmax * rng.uniform(0.01, 1, n))
    G = rng.integers(0, 4, n).astype(np.float64)
    cost = np.array([pipecost.cost1(A[j], B[j], C[j], Dd[j], Q1[j], M[j], R[j], Q[j], S[j], N[j], lmax[j], G[j])
                     for j in range(n)])
    from tidal.planner import kernels

    fns = [pipecost.cost1_floor] + ([kernels.compile_pipecost()["cost1_floor"]] if kernels.AVAILABLE else [])
    for f in fns:
        lo = np.array([f(A[j], B[j], C[j], Dd[j], Q1[j], M[j], Q[j], S[j], N[j], lmax[j], G[j]) for j in range(n)])
        assert np.all(lo <= cost), np.flatnonzero(lo > cost)[:5]
        assert np.median(lo / cost) > 0.95


def test_one_stage_is_priced_at_the_sum_of_its_micro_batches():
    """q = 0: f(V) = V c + W whatever w_max (the micro-batches run one after another), so best_v takes V_min; q >= 1:
    the steady-state formula (q + V) max(W / V + c, c + w_max), unchanged. A packed pipeline (packed_value) costs the
    same with w_max its slowest micro-batch's work."""
    for q, c, M, W, tok, wm, cnt, g in formula_cases(300, 3):
        vmin = max(1, -(-tok // M))
        vmax = max(vmin, cnt)
        for v in (vmin, vmax):
            f = pipecost.pipe_value(q, c, W, wm, v)
            if q == 0:
                assert f == pytest.approx(v * c + W, rel=1e-12)
            else:
                assert f == (q + v) * max(W / v + c, c + wm)
        if q == 0:
            assert pipecost.best_v(q, c, W, wm, vmin, vmax)[0] == vmin
            assert pipecost.greedy_cost(q, c, M, W, tok, wm, cnt, g) == pytest.approx(max(vmin, g) * c + W, rel=1e-12)
    rng = np.random.default_rng(4)
    for _ in range(100):
        works = rng.lognormal(-3, 1, int(rng.integers(1, 9)))
        c = float(rng.lognormal(-4, 1))
        W, v, top = float(works.sum()), works.size, c + float(works.max())
        assert pipecost.packed_value(0, c, W, top, v) == pytest.approx(float(np.sum(c + works)), rel=1e-12)
        assert pipecost.packed_value(0, c, W, top, v) == pipecost.pipe_value(0, c, W, top - c, v)
        assert pipecost.packed_value(2, c, W, top, v) == (2 + v) * top
