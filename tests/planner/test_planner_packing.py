import numpy as np
import pytest
from packer_contract import COEFFS, PackerContract

from tidal.baselines.fixed import pack_fixed
from tidal.costmodel import LatencyCoeffs
from tidal.planner.packing import pack, pipeline_time

pytestmark = pytest.mark.unit


class TestPackContract(PackerContract):
    packer = staticmethod(pack)


class TestFixedContract(PackerContract):
    packer = staticmethod(pack_fixed)


def test_pack_beats_token_ffd_on_quadratic_costs():
    rng = np.random.default_rng(0)
    wins = 0
    for _ in range(50):
        lengths = np.concatenate([rng.integers(1, 100, size=30), rng.integers(500, 1000, size=3)])
        a = pack(lengths, COEFFS[0], 2, 1024)
        b = pack_fixed(lengths, COEFFS[0], 2, 1024)
        assert a.est_time <= b.est_time * (1 + 1e-12)
        wins += a.est_time < b.est_time
    assert wins > 25


def test_pp1_prefers_fewest_micro_batches():
    # with PP = 1 and a constant cost per micro-batch, one micro-batch is optimal when it fits
    res = pack([10, 20, 30], COEFFS[0], 1, 100)
    assert len(res.micro_batches) == 1


def test_pipeline_time_empty():
    assert pipeline_time([], [], COEFFS[0], 4) == 0.0


@pytest.mark.parametrize("bad,msg", [
    (lambda n: ((0, 1), (1,)) + ((tuple(range(2, n)),) if n > 2 else ()), "exactly once"),  # 1 twice, n-1 missing
    (lambda n: (tuple(range(n - 1)),), "exactly once"),  # one missing
    (lambda n: ((0, n),) + ((tuple(range(1, n)),) if n > 1 else ()), "exactly once"),  # an index out of range
    (lambda n: (tuple(range(n)),), "tokens > MaxLen"),  # everything in one micro-batch
])
def test_a_packer_that_breaks_the_invariants_is_an_error(bad, msg):
    """select_step checks every packer's output (a third-party Packer may be wrong): each sequence of the pipeline
    exactly once, no micro-batch over MaxLen; a one-line TidalError otherwise."""
    from planner_synth import PROFILES

    from tidal.core import TidalError
    from tidal.planner.packing import PackResult
    from tidal.planner.select import select_step

    def packer(lengths, coeffs, pp, max_len, *, exact=False):
        return PackResult(bad(len(lengths)), 1.0)

    prof = PROFILES[0]
    l_ = np.full(40, prof.max_len // 2, dtype=np.int64)  # some pipeline gets >= 3: over MaxLen in one micro-batch
    with pytest.raises(TidalError, match=msg):
        select_step(l_, [prof], packer=packer)


def test_pack_checks_its_own_micro_batches():
    """select_step does not re-check `pack`'s output (decision 69's review): pack checks MaxLen itself, where it is
    one bincount (each sequence exactly once holds by construction). A search that put everything in one bin
    (here forced through the `loops` argument) is a one-line TidalError, not a plan over MaxLen."""
    from types import SimpleNamespace

    from tidal.core import TidalError

    def one_bin(l_, *args):  # kernels_pack.pack_core's answer: every sequence in one micro-batch
        return np.arange(l_.size), np.array([l_.size]), 1.0, int(l_.sum())

    with pytest.raises(TidalError, match="tokens > MaxLen 100"):
        pack([60, 60, 60, 60], COEFFS[0], 1, 100, loops=SimpleNamespace(pack_core=one_bin))


def test_finish_groups_and_times_exactly_as_pipeline_time():
    # finish (every packer's last step, kernels_pack.layout): micro-batches ascending within, ordered by first index,
    # empty bins dropped; its time is the same float as pipeline_time of those micro-batches, plain and compiled
    from tidal.planner.packing import finish

    rng = np.random.default_rng(3)
    for trial in range(40):
        n = int(rng.integers(1, 60))
        l_ = rng.integers(1, 5000, size=n).astype(np.int64)
        bins = rng.integers(0, int(rng.integers(1, 12)), size=n).astype(np.int64)
        co, pp = COEFFS[trial % len(COEFFS)], 1 + trial % 3
        want = tuple(tuple(int(i) for i in np.flatnonzero(bins == b)) for b in np.unique(bins))
        want = tuple(sorted(want, key=lambda g: g[0]))
        for loops in _loop_modes():
            res = finish(bins, l_, co, pp, loops=loops)
            assert res.micro_batches == want
            assert res.est_time == pipeline_time(l_, want, co, pp)


def _loop_modes(module="kernels_pack"):
    """A kernels module's loops: plain, and compiled where numba is installed."""
    import importlib

    k = importlib.import_module(f"tidal.planner.{module}")
    return [k.PLAIN] + ([k.COMPILED] if k.COMPILED is not None else [])


def test_np_sum_is_numpys_sum_in_both_modes():
    """kernels_sums.np_sum (numpy's pairwise summation, replayed in the compiled packer) gives np.sum's float on
    every length around its block edges (7/8, 128/129, the recursive split) and on slices, plain and compiled."""
    rng = np.random.default_rng(11)
    sizes = [0, 1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 135, 255, 256, 257, 1000, 1031, 4099]
    sizes += rng.integers(0, 3000, size=60).tolist()
    for loops in _loop_modes("kernels_sums"):
        for n in sizes:
            x = rng.random(n + 5) * 10.0 ** rng.integers(-9, 4, n + 5)
            lo = int(rng.integers(0, 6))
            m = min(n, x.size - lo)
            assert loops.np_sum(x, lo, m) == float(np.sum(x[lo:lo + m])), (n, lo)


def _pack_by_numpy_steps(l_, co, pp, M, loops):
    """packing.pack's heuristic path as numpy steps (before kernels_pack.pack_core): the reference pack_core must
    equal float for float."""
    from tidal.planner.bounds import PipeCost
    from tidal.planner.packing import PackResult
    from tidal.planner.pipecost import best_v, pipe_value

    p = PipeCost.of(co, pp, M)
    w = p.work(l_)
    n, S, W, wmax = l_.size, int(l_.sum()), float(w.sum()), float(w.max())
    vmin = max(1, -(-S // M))
    v_opt, _ = best_v(p.q, p.c, W, wmax, vmin, n)
    if v_opt == 1:
        return PackResult((tuple(range(n)),), pipe_value(p.q, p.c, W, wmax, 1))
    v_hi = min(n, max(min(n, max(vmin, int(S // co.util_len()))), v_opt + 2))
    bins, _ = loops.pack_search(l_, w, np.argsort(-l_, kind="stable"), M, p.c, p.q, W, wmax, vmin, v_opt, v_hi,
                                20 + 2 * n)
    # the layout as numpy steps (packing.finish before kernels_pack.layout), timed by pipeline_time
    order = np.argsort(bins, kind="stable")
    cnt = np.bincount(bins)
    cnt = cnt[cnt > 0]
    ends = np.cumsum(cnt)
    by_first = np.argsort(order[ends - cnt])
    mbs = tuple(tuple(order[a:b].tolist()) for a, b in zip((ends - cnt)[by_first], ends[by_first]))
    return PackResult(mbs, pipeline_time(l_, mbs, co, pp))


def test_pack_core_equals_the_numpy_steps_in_both_modes():
    """pack's one compiled call (kernels_pack.pack_core) gives the micro-batches and the estimate, float for float,
    that the numpy steps it replaced give: ties, a per-document term, c = 0, one micro-batch, Eq. 1 pricing,
    pipelines of 1-4 stages and more than 128 sequences (numpy's pairwise sums split there)."""
    from tidal.planner.bounds import Eq1Coeffs

    rng = np.random.default_rng(12)
    for k, loops in enumerate(_loop_modes()):
        for t in range(60 if k == 0 else 300):  # the plain loops are slow
            n = int(rng.integers(2, 400 if t % 4 == 0 else 60))
            M = int(rng.integers(50, 4000))
            l_ = rng.integers(1, M + 1, size=n).astype(np.int64)
            if t % 3 == 0:
                l_ = rng.choice(l_[:5], size=n)  # ties
            a, b = float(rng.choice([1e-6, 1e-4, 0.0])), float(rng.choice([1e-3, 1e-2]))
            c, d = float(rng.choice([0.0, 0.05, 0.5, 5.0])), float(rng.choice([0.0, 0.02]))
            co = (Eq1Coeffs if t % 5 == 0 else LatencyCoeffs)(a, b, c, d)
            pp = int(rng.choice([1, 2, 4]))
            assert pack(l_, co, pp, M, loops=loops) == _pack_by_numpy_steps(l_, co, pp, M, loops), t


def test_mb_works_is_numpys_work_sum_in_both_modes():
    """pipeline_time's per-micro-batch work (kernels_sums.mb_works) is np.sum of a x^2 + b x + d over each
    micro-batch's lengths, float for float, negative indices as numpy's; an index out of range is an IndexError."""
    rng = np.random.default_rng(13)
    for loops in _loop_modes("kernels_sums"):
        for _ in range(30):
            lf = rng.integers(1, 40000, size=int(rng.integers(1, 600))).astype(np.float64)
            sizes = rng.integers(1, 300, size=int(rng.integers(1, 6)))
            flat = rng.integers(-lf.size, lf.size, size=int(sizes.sum()))
            a, b, d = float(rng.choice([1e-9, 3e-7])), float(rng.choice([1e-4, 2e-3])), float(rng.choice([0.0, 0.3]))
            want = [float(np.sum(a * x * x + b * x + d)) for x in np.split(lf[flat], np.cumsum(sizes)[:-1])]
            assert loops.mb_works(lf, flat, sizes, a, b, d).tolist() == want
        with pytest.raises(IndexError):
            loops.mb_works(lf, np.array([lf.size]), np.array([1]), 1.0, 1.0, 0.0)
    with pytest.raises(IndexError):
        pipeline_time([5, 6], [(0, 2)], COEFFS[0], 2)


def test_pipe_reports_equal_the_token_and_imbalance_figures_in_both_modes():
    """select._reports' per-pipeline figures from one call (kernels_sums.pipe_reports) equal, float for float, the
    tokens and metrics.mb_imbalance per pipeline (empty pipelines, one micro-batch, c = 0, Eq. 1 pricing, more than
    128 documents); a negative micro-batch time is flagged (metrics' error)."""
    from tidal.planner.bounds import PipeCost
    from tidal.planner.metrics import mb_imbalance

    rng = np.random.default_rng(14)
    for loops in _loop_modes("kernels_sums"):
        for _ in range(40):
            n_p = int(rng.integers(1, 12))
            pcs = [PipeCost(float(rng.choice([1e-6, 1e-4])), float(rng.choice([1e-3, 1e-2])),
                            float(rng.choice([0.0, 0.05, 0.5])), int(rng.choice([1, 2, 4])),
                            int(rng.integers(100, 5000)), float(rng.choice([0.0, 0.02])), bool(rng.integers(0, 2)))
                   for _ in range(n_p)]
            docs = rng.integers(0, 300, size=n_p) * (rng.random(n_p) < 0.8)
            mbs = np.array([0 if k == 0 else int(rng.integers(1, min(k, 9) + 1)) for k in docs], dtype=np.int64)
            sub = rng.integers(1, 3000, size=int(docs.sum())).astype(np.int64)
            pipe_of = np.repeat(np.arange(n_p), docs)
            mb_of = np.concatenate([np.sort(rng.integers(0, m, size=k)) + int(mbs[:j].sum()) if k else
                                    np.zeros(0, np.int64) for j, (k, m) in enumerate(zip(docs, mbs))]).astype(np.int64)
            a, b, c, d = (np.array([getattr(p, k) for p in pcs]) for k in "abcd")
            lf = sub.astype(np.float64)
            wdoc = a[pipe_of] * lf * lf + b[pipe_of] * lf + d[pipe_of]
            mb_work = np.bincount(mb_of, weights=wdoc, minlength=int(mbs.sum()))
            de, me = np.cumsum(docs), np.cumsum(mbs)
            tok, imb, bad = loops.pipe_reports(sub, mb_work, de, me, c)
            assert not bad
            for j, p in enumerate(pcs):
                s, e, m0, m1 = de[j] - docs[j], de[j], me[j] - mbs[j], me[j]
                assert tok[j] == int(sub[s:e].sum())
                assert imb[j] == (mb_imbalance(p.c + mb_work[m0:m1]) if m1 - m0 > 1 else 1.0)
        assert loops.pipe_reports(np.ones(2, np.int64), np.array([1.0, -5.0]), np.array([2]), np.array([2]),
                                  np.array([0.5]))[2]


@pytest.mark.parametrize("exact", [False, True])
def test_pack_names_its_sequences_by_ids(exact):
    """pack(ids=) (passes.pack_groups' call, decision 121) is pack with each index i replaced by ids[i]: the same
    micro-batches and estimate, on the heuristic and the exact path, one sequence and one micro-batch included."""
    rng = np.random.default_rng(1)
    for n, pp in ((1, 2), (3, 1), (6, 2)) if exact else ((1, 2), (3, 1), (12, 2), (40, 3)):
        lengths = rng.integers(1, 400, size=n)
        ids = np.sort(rng.choice(10_000, size=n, replace=False)).astype(np.int64)
        ref = pack(lengths, COEFFS[0], pp, 1024, exact=exact)
        got = pack(lengths, COEFFS[0], pp, 1024, exact=exact, ids=ids)
        assert got.est_time == ref.est_time
        assert got.micro_batches == tuple(tuple(int(ids[i]) for i in mb) for mb in ref.micro_batches)
