"""CP attention kernel model (tile padding, saturating achieved FLOPs, fit) and imbalance metrics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.core import TidalError
from tidal.costmodel.kernel import KernelModel, causal_pairs, fit_achieved, padded_pairs
from tidal.planner.metrics import max_over_mean, mb_imbalance, rank_spread, token_delay

pytestmark = pytest.mark.unit


def _brute(s, n, tile):
    qt = [(s + j, min(s + j + tile, s + n)) for j in range(0, n, tile)]
    return sum(-(-e // tile) for _, e in qt) * tile * tile


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.integers(1, 1500), st.sampled_from([1, 16, 128]))
def test_padding_covers_exact_pairs(s, n, tile):
    exact = causal_pairs(s, n)
    assert exact == sum(i + 1 for i in range(s, s + n))
    pad = padded_pairs(s, n, tile)[0]
    assert pad == _brute(s, n, tile)
    assert pad >= exact
    if tile == 1:
        assert pad == exact


def test_padded_pairs_vectorised():
    s = np.array([0, 5, 300, 0])
    n = np.array([1, 200, 129, 4096])
    assert padded_pairs(s, n, 128).tolist() == [_brute(a, b, 128) for a, b in zip(s, n)]


def test_short_queries_cost_a_full_tile():
    k = KernelModel()
    t = k.piece_times(np.zeros(4, int), np.array([16, 64, 128, 256]))
    assert t[0] == t[1] == t[2] < t[3]  # flat up to one tile (WLB Fig. 10 left)
    a = k.achieved([128, 256, 1024, 65536])
    assert a[1] / a[0] > 1.5 and a[3] / k.peak > 0.99  # jump 128 -> 256, saturation


def test_fit_recovers_parameters():
    true = KernelModel(peak=5e14, q_half=300.0, hill=1.5)
    q = np.array([128, 256, 384, 512, 1024, 2048, 4096, 16384])
    got = fit_achieved(q, true.achieved(q))
    assert got.peak == pytest.approx(5e14, rel=1e-3) and got.q_half == pytest.approx(300, rel=1e-3)
    with pytest.raises(TidalError):
        fit_achieved([1, 2], [1.0, 2.0])
    with pytest.raises(TidalError):
        KernelModel(tile=0)


def test_metrics():
    assert mb_imbalance([1, 1, 1, 1]) == 1.0
    assert mb_imbalance([2, 1, 1, 0]) == 2.0
    assert rank_spread([4, 3, 2]) == 0.5
    assert rank_spread([]) == 0.0 and max_over_mean([0, 0]) == 1.0
    assert token_delay([10, 30], [1, 0]) == 0.25
    with pytest.raises(TidalError):
        token_delay([1], [1, 2])
    with pytest.raises(TidalError):
        mb_imbalance([1, -1])


def test_kernel_for_model():
    from tidal.core import get_model
    from tidal.costmodel.kernel import kernel_for

    k = kernel_for(get_model("llama2-7b"), tp=2, layers=32, passes=3.0)
    assert k.flops_per_pair == 3 * 4 * 4096 / 2 * 32
    with pytest.raises(TidalError):
        kernel_for(get_model("tiny"), tp=0)
