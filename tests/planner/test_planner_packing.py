import numpy as np
import pytest
from packer_contract import COEFFS, PackerContract

from tidal.planner.packing import pack, pack_fixed, pipeline_time

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
