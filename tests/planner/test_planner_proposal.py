import math

import numpy as np
import pytest

from tidal.core import TidalError, get_cluster, get_model
from tidal.costmodel import default_cost_model
from tidal.planner.bounds import PipeCost
from tidal.planner.proposal import _device, _histogram, expected_cost, propose, scheme_space

pytestmark = pytest.mark.unit


def _lengths(seed, n=3000, heavy=False):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(7.0 if heavy else 6.0, 1.5 if heavy else 1.3, size=n)
    return np.clip(x, 1, 32768).astype(np.int64)


def test_scheme_space_includes_cp_and_respects_model():
    cm = default_cost_model(get_model("llama2-7b"), get_cluster("a800x64"))
    space = scheme_space(cm)
    assert any(s.cp > 1 for s in space)
    assert all(32 % s.tp == 0 and 32 % s.pp == 0 and s.num_devices <= 64 for s in space)
    assert all(s.tp <= 8 for s in space)
    assert any(s.pp == 3 for s in scheme_space(cm, pp_divisors=False, max_pp=6))


def _exhaustive(lengths, cm, *, tokens_per_step, max_len, schemes) -> float:
    """Reference for small N: the least expected_cost over every multiset of `schemes` within the cluster's devices
    (exponential)."""
    dev = _device(cm)
    pc = [PipeCost.of(cm.coeffs(s, dev), s.pp, cm.max_len(s, dev)) for s in schemes]
    hist = _histogram(lengths, tokens_per_step, max_len)
    best = math.inf

    def rec(start: int, left: int, chosen: list[int]) -> None:
        nonlocal best
        if chosen:
            best = min(best, expected_cost(hist, [pc[k] for k in chosen]))
        for k in range(start, len(schemes)):
            if schemes[k].num_devices <= left:
                chosen.append(k)
                rec(k, left - schemes[k].num_devices, chosen)
                chosen.pop()

    rec(0, cm.cluster.num_devices, [])
    return best


CASES = [(c, s, h, ml) for ml in (4096, 8192, 16384)
         for c, s, h in (("a800x8", 0, False), ("a800x8", 1, True), ("a800x4", 2, True), ("h100x8", 3, False))]
CASES.append(("a800x16", 4, True, 8192))


@pytest.mark.slow
@pytest.mark.parametrize("cluster,seed,heavy,max_len", CASES)
def test_proposal_close_to_exhaustive_on_small_n(cluster, seed, heavy, max_len):
    cm = default_cost_model(get_model("llama2-7b"), get_cluster(cluster))
    lengths = _lengths(seed, heavy=heavy)
    tokens = 25_000 * cm.cluster.num_devices // 8
    space = scheme_space(cm, max_cp=4, max_pp=4)
    assert any(s.cp > 1 for s in space)
    prop = propose(lengths, cm, tokens_per_step=tokens, max_len=max_len, schemes=space, eval_steps=1)
    best = _exhaustive(lengths, cm, tokens_per_step=tokens, max_len=max_len, schemes=space)
    assert np.isfinite(best)
    assert prop.dp_best <= 1.05 * best, (prop.dp_best, best)
    assert all(s.num_devices <= cm.cluster.num_devices for s in prop.strategies)


def test_proposal_is_deterministic_and_holds_longest():
    cm = default_cost_model(get_model("llama2-7b"), get_cluster("a800x64"))
    lengths = _lengths(5, heavy=True)
    a = propose(lengths, cm, tokens_per_step=200_000, max_len=32768, eval_steps=2)
    b = propose(lengths.copy(), cm, tokens_per_step=200_000, max_len=32768, eval_steps=2)
    assert [str(s) for s in a.strategies] == [str(s) for s in b.strategies]
    assert 1 <= len(a.strategies) <= 8
    top = int(min(lengths.max(), 32768))
    dev = cm.cluster.device_type(0)
    assert max(cm.max_len(p.scheme, dev) for p in a.strategies[0].pipelines) >= top


def test_proposal_bad_input():
    cm = default_cost_model(get_model("llama2-7b"), get_cluster("a800x8"))
    with pytest.raises(TidalError):
        propose([], cm, tokens_per_step=1000, max_len=4096)
    with pytest.raises(TidalError):
        propose([10], cm, tokens_per_step=0, max_len=4096)


def test_expected_cost_monotone_in_pipelines():
    h = _histogram(_lengths(9), 50_000, 32768)
    p = PipeCost(1e-9, 3e-5, 0.005, 1, 40000)
    assert expected_cost(h, [p, p]) <= expected_cost(h, [p])


def test_proposal_covers_max_len_when_the_sample_holds_no_long_document():
    """Issue 9: a flanv2-like sample (nothing above 4K) with --max-len 16384 must still yield candidates that run a
    16K sequence, the first one (best single strategy) included."""
    cm = default_cost_model(get_model("llama-32b"), get_cluster("a800x16"))
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(5.0, 1.0, 4000), 1, 4000).astype(np.int64)
    assert lengths.max() < 16384
    dev = cm.cluster.device_type(0)
    prop = propose(lengths, cm, tokens_per_step=50_000, max_len=16384, eval_steps=2)
    assert max(cm.max_len(p.scheme, dev) for p in prop.strategies[0].pipelines) >= 16384
    assert all(np.isfinite(prop.expected[:1]))
