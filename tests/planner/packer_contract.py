"""Contract every packer (tidal.planner.packing.Packer) must satisfy. Subclass with `packer = staticmethod(fn)`:

    class TestMyPacker(PackerContract):
        packer = staticmethod(my_pack)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal.core import TidalError
from tidal.costmodel import LatencyCoeffs
from tidal.planner.bounds import PipeCost, pipeline_bound
from tidal.planner.packing import pipeline_time

COEFFS = (LatencyCoeffs(1e-4, 1e-2, 0.05), LatencyCoeffs(0.0, 1e-2, 0.0), LatencyCoeffs(1e-3, 0.0, 0.2),
          LatencyCoeffs(2e-5, 5e-3, 0.001), LatencyCoeffs(2e-5, 5e-3, 0.001, 0.02))


class PackerContract:
    packer = None  # staticmethod(callable) in subclasses
    examples = 2500  # hypothesis examples of the property test

    def run(self, lengths, coeffs=COEFFS[0], pp=2, max_len=256, exact=False):
        arr = np.asarray(lengths) if len(lengths) else np.zeros(0, dtype=np.int64)
        return type(self).packer(arr, coeffs, pp, max_len, exact=exact)

    def check(self, lengths, res, coeffs, pp, max_len):
        l_ = np.asarray(lengths, dtype=np.int64)
        flat = sorted(i for mb in res.micro_batches for i in mb)
        assert flat == list(range(l_.size)), "every sequence exactly once"
        assert all(len(mb) > 0 for mb in res.micro_batches), "no empty micro-batch"
        for mb in res.micro_batches:
            assert int(l_[list(mb)].sum()) <= max_len, "micro-batch over MaxLen"
        assert res.est_time == pytest.approx(pipeline_time(l_, res.micro_batches, coeffs, pp), rel=1e-9, abs=1e-12)
        assert res.est_time >= pipeline_bound(l_, PipeCost.of(coeffs, pp, max_len))

    def test_empty(self):
        res = self.run([])
        assert res.micro_batches == () and res.est_time == 0.0

    def test_single(self):
        res = self.run([17])
        assert res.micro_batches == ((0,),)
        assert res.est_time == pytest.approx(2 * COEFFS[0].mb_time([17]))

    def test_all_ones(self):
        lengths = [1] * 50
        res = self.run(lengths, max_len=7)
        self.check(lengths, res, COEFFS[0], 2, 7)

    def test_exactly_max_len(self):
        lengths = [256, 256, 1]
        res = self.run(lengths)
        self.check(lengths, res, COEFFS[0], 2, 256)

    def test_rejects_too_long(self):
        with pytest.raises(TidalError):
            self.run([10, 257])

    @pytest.mark.parametrize("bad", [[0, 3], [-1], [[1, 2]], [1.5]])
    def test_rejects_bad_lengths(self, bad):
        with pytest.raises(TidalError):
            self.run(bad)

    def test_deterministic(self):
        rng = np.random.default_rng(3)
        lengths = rng.integers(1, 200, size=60)
        assert self.run(lengths) == self.run(lengths.copy())

    @settings(max_examples=2500, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    @given(lengths=st.lists(st.integers(1, 300), max_size=40), ci=st.integers(0, len(COEFFS) - 1),
           pp=st.integers(1, 6), max_len=st.integers(300, 1200))
    def test_properties(self, lengths, ci, pp, max_len):
        coeffs = COEFFS[ci]
        res = self.run(lengths, coeffs, pp, max_len)
        self.check(lengths, res, coeffs, pp, max_len)
