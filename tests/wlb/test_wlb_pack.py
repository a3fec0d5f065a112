"""WLB in-pipeline packer: the shared Packer signature and invariants (valid partition, MaxLen, est_time)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.baselines.wlb import pack
from tidal.core import TidalError
from tidal.costmodel.base import LatencyCoeffs
from tidal.planner.packing import PackResult, pipeline_time

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "wlb_packer_contract", Path(__file__).resolve().parents[1] / "planner" / "packer_contract.py")
_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_contract)


class TestWLBPackContract(_contract.PackerContract):
    packer = staticmethod(pack)


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 500), max_size=40), pp=st.integers(1, 6), max_len=st.integers(500, 1500),
       a=st.floats(0, 1e-3), b=st.floats(0, 1e-2), c=st.floats(0, 1.0))
def test_valid_partition_and_time(lengths, pp, max_len, a, b, c):
    co = LatencyCoeffs(a, b, c)
    r = pack(np.array(lengths, dtype=np.int64), co, pp, max_len)
    assert isinstance(r, PackResult)
    flat = sorted(i for mb in r.micro_batches for i in mb)
    assert flat == list(range(len(lengths)))
    assert all(mb and sum(lengths[i] for i in mb) <= max_len for mb in r.micro_batches)
    assert r.est_time == pytest.approx(pipeline_time(lengths, r.micro_batches, co, pp))
    assert r == pack(np.array(lengths), co, pp, max_len)  # deterministic


def test_empty_and_bad():
    co = LatencyCoeffs(1e-6, 1e-3, 0.01)
    assert pack(np.array([], dtype=np.int64), co, 2, 10) == PackResult((), 0.0)
    for bad in (dict(lengths=np.array([11]), pp=1, max_len=10), dict(lengths=np.array([0]), pp=1, max_len=10),
                dict(lengths=np.array([[1]]), pp=1, max_len=10), dict(lengths=np.array([1]), pp=0, max_len=10)):
        with pytest.raises(TidalError):
            pack(bad["lengths"], co, bad["pp"], bad["max_len"])


def test_balances_quadratic_work():
    co = LatencyCoeffs(1e-9, 1e-6, 1e-3)
    rng = np.random.default_rng(0)
    lens = np.concatenate([[60000], rng.integers(100, 4000, size=80)])
    r = pack(lens, co, 4, 120000)
    w = co.doc_cost(lens)
    bound = min((4 - 1 + v) * max(co.c + w.max(), co.c + w.sum() / v)
                for v in range(1, 82) if v * 120000 >= lens.sum())
    assert r.est_time <= 1.05 * bound
