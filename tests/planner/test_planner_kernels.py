"""The planner's loops are written once (kernels.py, kernels_pack.py, kernels_modes.py, alg1.py;
decisions 89, 96, 102): compiled with numba (`COMPILED`) and run as plain Python (`PLAIN`, the fallback without
numba), they make the same choices, float for float. The last test plans in a process where numba is hidden and
compares the plans."""

import numpy as np
import pytest
from ls_reference import local_search_reference

from tidal.core.errors import TidalError
from tidal.planner import dispatch as d
from tidal.planner import kernels
from tidal.planner.bounds import PipeCost

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed (only the plain loops run)")]

KINDS = [PipeCost(1e-3, 1.0, 0.5, 1, 64), PipeCost(0.5e-3, 0.5, 0.5, 2, 128), PipeCost(2e-4, 0.25, 1.0, 4, 200),
         PipeCost(2e-3, 2.0, 0.1, 1, 40), PipeCost(1e-4, 0.3, 0.0, 2, 150), PipeCost(3e-4, 0.2, 0.2, 1, 256),
         PipeCost(3e-4, 0.2, 0.2, 1, 256, 0.7), PipeCost(1e-4, 0.3, 0.1, 2, 150, 2.0)]  # with a per-document term


def _case(rng):
    pipes = [KINDS[rng.integers(0, len(KINDS))] for _ in range(rng.integers(1, 40))]
    top = max(p.max_len for p in pipes)
    l_ = rng.integers(1, top + 1, size=rng.integers(1, 300)).astype(np.int64)
    return pipes, l_


def test_compiled_greedy_matches_plain():
    rng = np.random.default_rng(0)
    scanned = 0
    for t in range(300):
        pipes, l_ = _case(rng)
        order = None if t % 2 else rng.permutation(l_.size)
        for scan in (False, True) if t < 60 else ():  # with and without the jump scan (decision 63); plain is slow
            np.testing.assert_array_equal(d.greedy_owner(l_, pipes, order, loops=kernels.COMPILED, scan=scan),
                                          d.greedy_owner(l_, pipes, order, loops=kernels.PLAIN, scan=scan))
        scanned += not np.array_equal(d.greedy_owner(l_, pipes, order, scan=True),
                                      d.greedy_owner(l_, pipes, order, scan=False))
    assert scanned >= 10  # the jump scan changes choices on some of these cases, so both of its paths are compared


def test_compiled_alg1_matches_plain():
    """Hydraulis Alg. 1's one source (alg1.alg1_trial), compiled and as plain Python: the same
    dispatch (with the per-document term d, which the paper-loop tests leave out)."""
    from tidal.planner.alg1 import alg1_trial, compiled, dispatch_hydraulis

    rng = np.random.default_rng(1)
    for t in range(300):
        pipes, l_ = _case(rng)
        a = dispatch_hydraulis(l_, pipes, trials=2, seed=t, trial=compiled(alg1_trial))
        b = dispatch_hydraulis(l_, pipes, trials=2, seed=t, trial=alg1_trial)
        assert a == b


@pytest.mark.parametrize("mode", ["COMPILED", "PLAIN"])
def test_greedy_refuses_a_sequence_no_pipeline_holds(mode):
    pipes = [PipeCost(1e-3, 1.0, 0.5, 1, 64)]
    with pytest.raises(TidalError, match="exceeds the MaxLen"):
        d.greedy_owner(np.array([10, 65]), pipes, loops=getattr(kernels, mode))


def test_compiled_packing_rounds_match_plain():
    """The packer's LPT and move/swap rounds (kernels_pack, one source) compiled and as plain Python: the same bins."""
    from tidal.planner import kernels_pack as kp

    rng = np.random.default_rng(2)
    for t in range(400):
        n = int(rng.integers(1, 120))
        M = int(rng.integers(50, 2000))
        l_ = rng.integers(1, min(M, 400) + 1, size=n).astype(np.int64)
        if t % 3 == 0:
            l_ = rng.choice(l_[:5], size=n)  # many equal lengths: ties
        w = 1e-4 * l_ * l_ + 0.01 * l_
        order = np.argsort(-l_, kind="stable")
        V = int(rng.integers(1, n + 1))
        c = float(rng.choice([0.0, 0.5]))
        out = []
        for loops in (kp.COMPILED, kp.PLAIN):
            bins, ok = loops.lpt(l_, w, order, V, M, c)
            if ok:
                T = np.bincount(bins, weights=w, minlength=V) + c
                tok = np.bincount(bins, weights=l_, minlength=V).astype(np.int64)
                loops.refine(bins, l_, w, T, tok, V, M, 20 + 2 * n, 32, order[::-1].copy())
            out.append((ok, bins if ok else None))
        assert out[0][0] == out[1][0]
        if out[0][0]:
            np.testing.assert_array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("mode", ["COMPILED", "PLAIN"])
def test_packing_rounds_equal_the_index_order_reference(mode):
    """Decision 121: the packer's move/swap rounds (kernels_pack.refine: swap partners by micro-batch and length,
    between the bounds their two new times set) against the index-order scan they replaced (refine_reference.py, main
    e799719), compiled and plain: the same bins, times and token counts after 1-60 rounds from random bins (many moves
    and swaps), with equal lengths (ties), constant works (a = b = 0) and 1, 4 or 32 candidates."""
    from refine_reference import refine_reference

    from tidal.planner import kernels_pack as kp

    loops = getattr(kp, mode)
    rng = np.random.default_rng(5)
    moved = 0
    for t in range(150 if mode == "COMPILED" else 40):
        n = int(rng.integers(2, 120 if t % 5 == 0 else 40))
        M = int(rng.integers(100, 3000))
        l_ = rng.integers(1, 300, size=n).astype(np.int64)
        if t % 2 == 0:
            l_ = rng.choice(l_[:4], size=n)  # ties
        a, b, d = (float(rng.choice(x)) for x in ((0.0, 1e-4, 3e-5), (0.0, 0.01, 1.0), (0.0, 0.2)))
        w = a * l_ * l_ + b * l_ + d
        V = int(rng.integers(2, max(3, n // 2)))
        bins0 = rng.integers(0, V, n)
        rounds, max_docs = int(rng.integers(1, 60)), int(rng.choice([1, 4, 32]))
        out = []
        for f, extra in ((refine_reference, ()), (loops.refine, (np.argsort(l_, kind="stable"),))):
            bins = bins0.copy()
            T = np.bincount(bins, weights=w, minlength=V) + 0.3
            tok = np.bincount(bins, weights=l_, minlength=V).astype(np.int64)
            f(bins, l_, w, T, tok, V, M, rounds, max_docs, *extra)
            out.append((bins.tolist(), T.tolist(), tok.tolist()))
        assert out[0] == out[1], t
        moved += int((np.asarray(out[0][0]) != bins0).sum())
    assert moved > 200


def test_compiled_local_search_matches_plain():
    """The dispatch local search (kernels.local_search, with its pair swaps) compiled and as plain Python: same
    owners, loads and return value, on small (pairs), mid and large (> 256 documents, > 8 pipelines: swap partners
    from the 8 least-loaded pipelines) instances, with many equal lengths in some."""
    rng = np.random.default_rng(3)
    for t in range(20):
        pipes, l_ = _case(rng)
        if t % 4 == 0:
            l_ = rng.choice(l_[:4], size=l_.size)  # ties: equal lengths and equal loads
        if t % 5 == 0:
            l_ = np.concatenate([l_, rng.integers(1, 40, size=300)]).astype(np.int64)  # > 256 documents
        owner = d.greedy_owner(l_, pipes, rng.permutation(l_.size) if t % 2 else None)
        small = l_.size * len(pipes) <= 512
        rounds = 20 + len(pipes) + (l_.size if small else 0)
        target = 0.0 if t % 3 else float(rng.uniform(0, 1)) * float(d.SearchState(pipes, l_, owner.copy()).load.max())
        sts = [d.SearchState(pipes, l_, owner.copy(), loops=lp) for lp in (kernels.COMPILED, kernels.PLAIN)]
        res = [d.local_search(st, rounds, pairs=small or t % 7 == 0, target=target) for st in sts]
        assert res[0] == res[1]
        np.testing.assert_array_equal(sts[0].owner, sts[1].owner)
        for name in ("load", "S", "Q", "N", "G", "top1", "top2", "cnt1"):
            np.testing.assert_array_equal(getattr(sts[0], name), getattr(sts[1], name), err_msg=name)


def test_local_search_equals_the_index_order_reference():
    """kernels.local_search visits swap partners by pipeline and length between two cost floors, ties to the earlier
    (document of j, partner index) (decision 117): the same moves as the index-order scan it replaced
    (ls_reference.py, main fbe38d4, plain Python), compiled and plain: same owners, loads and return value, on small
    (pairs), mid and large (> 256 documents, > 8 pipelines) instances, with tied lengths and identical pipelines."""
    rng = np.random.default_rng(11)
    for t in range(60):
        pipes, l_ = _case(rng)
        if t % 3 == 0:
            pipes = [KINDS[int(rng.integers(0, 2))] for _ in range(int(rng.integers(2, 14)))]  # equal loads
        if t % 4 == 0:
            l_ = rng.choice(l_[:3], size=l_.size)  # ties: few distinct lengths
        if t % 5 == 1:
            top = min(p.max_len for p in pipes)
            l_ = np.concatenate([l_, rng.integers(1, top + 1, size=300)]).astype(np.int64)  # > 256 documents
        l_ = np.minimum(l_, max(p.max_len for p in pipes))
        owner = d.greedy_owner(l_, pipes, rng.permutation(l_.size) if t % 2 else None)
        small = l_.size * len(pipes) <= 512
        rounds = 20 + len(pipes) + (l_.size if small else 0)
        pairs = small or t % 7 == 0
        ref = d.SearchState(pipes, l_, owner.copy(), loops=kernels.PLAIN)
        done = local_search_reference(ref.l, ref.lf, ref.owner, ref.A, ref.B, ref.C, ref.D, ref.Q1, ref.M, ref.R,
                                      ref.H, ref.S, ref.Q, ref.N, ref.G, ref.top1, ref.cnt1, ref.top2, ref.load,
                                      rounds, 16, pairs, 0.0, 1e-4)
        for lp in (kernels.COMPILED, kernels.PLAIN) if t % 6 == 0 else (kernels.COMPILED,):
            st = d.SearchState(pipes, l_, owner.copy(), loops=lp)
            assert lp.local_search(st.l, st.lf, st.owner, st.A, st.B, st.C, st.D, st.Q1, st.M, st.R, st.H, st.S,
                                   st.Q, st.N, st.G, st.top1, st.cnt1, st.top2, st.load, *d.length_orders(l_), rounds,
                                   16, pairs, 0.0, 1e-4) == done
            np.testing.assert_array_equal(st.owner, ref.owner)
            np.testing.assert_array_equal(st.load, ref.load)


def _tied_cases(seed: int, count: int):
    """(pipes, lengths, greedy owner) of `count` random cases, every other one with many tied lengths."""
    rng = np.random.default_rng(seed)
    for t in range(count):
        pipes, l_ = _case(rng)
        if t % 2 == 0:
            l_ = rng.choice(l_[:3], size=l_.size)  # ties
        yield pipes, l_, d.greedy_owner(l_, pipes, rng.permutation(l_.size))


def test_local_search_state_matches_a_fresh_one():
    """The local search updates its per-pipeline state in place, the top-two lengths in O(1) per move where it can
    (kernels.ls_move, decision 107): after it, every array equals a SearchState built afresh from the final owners
    (sums of integer lengths and their squares are exact), in both modes, with many tied lengths (counts of the
    longest > 1, second-longest removed)."""
    for t, (pipes, l_, owner) in enumerate(_tied_cases(7, 12)):
        for lp in (kernels.COMPILED, kernels.PLAIN):
            st = d.SearchState(pipes, l_, owner.copy(), loops=lp)
            d.local_search(st, 20 + len(pipes) + l_.size, pairs=t % 3 == 0)
            fresh = d.SearchState(pipes, l_, st.owner.copy(), loops=lp)
            for name in ("load", "S", "Q", "N", "G", "top1", "top2", "cnt1"):
                np.testing.assert_array_equal(getattr(st, name), getattr(fresh, name), err_msg=name)


def test_search_state_sums_equal_the_numpy_expressions():
    """SearchState's sums and top-two lengths, built in one loop (kernels.state_sums), equal the np.bincount /
    np.maximum.at expressions they replaced, exactly, in both modes (ties, empty pipelines, long documents)."""
    for pipes, l_, owner in _tied_cases(8, 20):
        n, lf = len(pipes), l_.astype(np.float64)
        H = np.array([p.max_len for p in pipes], dtype=np.float64) / 2
        top1 = np.zeros(n)
        np.maximum.at(top1, owner, lf)
        is_top = lf == top1[owner]
        top2 = np.zeros(n)
        np.maximum.at(top2, owner[~is_top], lf[~is_top])
        want = {"S": np.bincount(owner, weights=lf, minlength=n), "Q": np.bincount(owner, weights=lf * lf, minlength=n),
                "N": np.bincount(owner, minlength=n).astype(np.float64),
                "G": np.bincount(owner, weights=(lf > H[owner]).astype(np.float64), minlength=n),
                "top1": top1, "top2": top2, "cnt1": np.bincount(owner[is_top], minlength=n)}
        for lp in (kernels.COMPILED, kernels.PLAIN):
            st = d.SearchState(pipes, l_, owner.copy(), loops=lp)
            for name, v in want.items():
                np.testing.assert_array_equal(getattr(st, name), v, err_msg=name)


def test_compiled_dispatch_matches_python_with_deadline_far():
    rng = np.random.default_rng(4)
    for _ in range(50):
        pipes, l_ = _case(rng)
        a = d.dispatch(l_, pipes, seed=1)
        b = d.dispatch(l_, pipes, seed=1, deadline=1e18)  # chunked compiled rounds, deadline never reached
        assert a == b


def test_compiled_ffd_matches_plain():
    from tidal.planner import kernels_pack as kp

    rng = np.random.default_rng(5)
    for _ in range(200):
        M = int(rng.integers(10, 500))
        l_ = rng.integers(1, M + 1, size=int(rng.integers(1, 150))).astype(np.int64)
        order = np.argsort(-l_, kind="stable")
        np.testing.assert_array_equal(kp.COMPILED.ffd(l_, order, M), kp.PLAIN.ffd(l_, order, M))


def test_compiled_pack_matches_plain():
    """pack with its loops compiled and as plain Python (kernels_pack.COMPILED and .PLAIN, one source): the same
    micro-batches and estimate."""
    from tidal.costmodel.base import LatencyCoeffs
    from tidal.planner import kernels_pack as kp
    from tidal.planner import packing as pk

    rng = np.random.default_rng(6)
    for t in range(300):
        n = int(rng.integers(2, 150))
        M = int(rng.integers(50, 4000))
        l_ = rng.integers(1, min(M, int(rng.choice([100, 400, 4000]))) + 1, size=n).astype(np.int64)
        if t % 3 == 0:
            l_ = rng.choice(l_[:5], size=n)  # many equal lengths: ties
        co = LatencyCoeffs(float(rng.choice([1e-6, 1e-4])), float(rng.choice([1e-3, 1e-2])),
                           float(rng.choice([0.0, 0.05, 0.5, 5.0])))
        pp = int(rng.choice([1, 2, 4]))
        assert pk.pack(l_, co, pp, M, loops=kp.COMPILED) == pk.pack(l_, co, pp, M, loops=kp.PLAIN)


def test_compiled_top_docs_bound_matches_plain():
    """bounds.top_docs_bound's branch and bound (kernels_pack.top_search) compiled and as plain Python: the same
    value, node limit fallbacks included."""
    from tidal.planner import kernels_pack as kp
    from tidal.planner.bounds import top_docs_bound

    rng = np.random.default_rng(7)
    for t in range(300):
        pipes, l_ = _case(rng)
        if t % 3 == 0:
            l_ = rng.choice(l_[:3], size=l_.size)  # equal lengths: identical open pipelines
        r = int(rng.integers(1, 9))
        limit = int(rng.choice([5, 50, 3000]))
        assert top_docs_bound(l_, pipes, r=r, node_limit=limit, loops=kp.COMPILED) == \
            top_docs_bound(l_, pipes, r=r, node_limit=limit, loops=kp.PLAIN)


def test_compiled_mode_price_search_matches_plain():
    """modes.violated (3+ classes): the price search (kernels_modes.mode_violated, with and without the pair
    line searches of decision 102) compiled and as plain Python reaches the same verdict. The pipeline counts are
    scaled around the first price row's own ratio, so both verdicts occur."""
    from tidal.proof import kernels_modes as kp
    from tidal.proof.modes import violated
    rng = np.random.default_rng(7)
    verdicts = set()
    for _ in range(200):
        B, K, R = int(rng.integers(1, 200)), int(rng.integers(3, 7)), int(rng.integers(1, 5))
        U = rng.uniform(0.001, 1.0, size=(B, K))
        U[rng.random((B, K)) < 0.3] = np.inf
        U[np.arange(B), rng.integers(0, K, size=B)] = rng.uniform(0.001, 1.0, size=B)  # fits somewhere
        wt = rng.integers(1, 4, size=B).astype(np.float64)
        Y = rng.uniform(0.0, 1.0, size=(R, K))
        Y /= Y.sum(axis=1, keepdims=True)
        cnt = rng.integers(1, 20, size=K).astype(np.float64)
        lhs = float(np.where(np.isfinite(U), Y[0] * U, np.inf).min(axis=1) @ wt)
        cnt *= lhs / float(Y[0] @ cnt) * rng.uniform(0.8, 1.3)
        for rounds, sweeps in ((0, 0), (6, 0), (6, 2)):
            got = violated(U, wt, cnt, Y, rounds, loops=kp.COMPILED, sweeps=sweeps)
            assert got == violated(U, wt, cnt, Y, rounds, loops=kp.PLAIN, sweeps=sweeps)
            verdicts.add(got)
    assert verdicts == {True, False}


_PLAN = """
import json, sys
sys.modules["numba"] = None  # hide numba: every loop runs as plain Python
sys.path.insert(0, sys.argv[1])
from test_planner_kernels import plan_hashes
from tidal.planner import kernels
assert not kernels.AVAILABLE
print(json.dumps(plan_hashes()))
"""


def plan_hashes() -> list:
    """select_step's reported bounds and plan hash on 6 placed candidates of the grid's 16-GPU hand list (3+ classes
    on most: the mode bound's price search runs) and two 200K-token commoncrawl steps."""
    import hashlib
    import json

    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel import default_cost_model
    from tidal.data import sample_steps
    from tidal.planner.select import profile_strategies, select_step

    model, cluster = get_model("llama2-13b"), get_cluster("a800x16")
    texts = ("4*tp4", "tp8+tp4+2*tp2", "tp8cp2", "tp8+tp4+4*tp1", "2*tp4pp2", "tp4+4*tp2+4*tp1")
    profiles = profile_strategies([place(parse_strategy(s), cluster, model) for s in texts],
                                  default_cost_model(model, cluster))
    out = []
    for st in sample_steps("synthetic:commoncrawl", seed=0, tokens_per_step=200_000, max_len=32768, steps=2)[0]:
        sel = select_step(st.lengths_array(), profiles)
        blob = json.dumps(sel.plan.to_dict(timings=False), sort_keys=True).encode()
        out.append([[s.lower_bound for s in sel.strategies], hashlib.sha256(blob).hexdigest()])
    return out


def test_plain_mode_plans_like_the_compiled_mode():
    """select_step in a process without numba (every loop plain Python: dispatch, packer, bounds, Alg. 1) gives the
    same plans and reported bounds as here, with numba."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    plain = subprocess.run([sys.executable, "-c", _PLAN, str(Path(__file__).parent)], capture_output=True, text=True,
                           check=True).stdout
    assert json.loads(plain) == json.loads(json.dumps(plan_hashes()))
