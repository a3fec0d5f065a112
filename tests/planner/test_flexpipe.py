"""FlexPipe HBSA (flexpipe.txt Alg. 1): bounds, exact search within the bounds, memory, and trigger conditions."""

import itertools
import math

import pytest

from tidal.core.cluster import GB, ClusterSpec, DeviceType, NodeGroup
from tidal.core.model import ModelSpec
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.memory import MEMORY_V1
from tidal.planner.baselines.flexpipe import FlexPipePlanner, Mapping

pytestmark = pytest.mark.unit

A100 = DeviceType("a100", 312e12, 80 * GB, 300 * GB, 50 * GB, per_node=4)
GPT = ModelSpec("gpt-3.35b", 16, 4096, 32, 32, 16384, 50257)


def _planner(gpus=16, model=GPT):
    # MEMORY_V1 (34 B of activations): the scenarios below were sized for it (decision 76: 36 / TP + 1.25)
    return FlexPipePlanner(AnalyticCostModel(model, ClusterSpec("t", (NodeGroup(A100, gpus),))), memory=MEMORY_V1)


def _compositions(total, parts, lo, hi):
    for c in itertools.product(range(lo, hi + 1), repeat=parts):
        if sum(c) == total:
            yield c


@pytest.mark.parametrize("gpus,mu,old", [(16, 8192, None), (10, 16384, None), (10, 16384, "even3")])
def test_search_equals_brute_force_within_bounds(gpus, mu, old):
    fp = _planner(gpus)
    s1, s2, nm = 4.0 * mu, 2.0 * mu * mu, 6
    N = fp.n_stage(mu, s1)
    assert N >= 2
    prev = fp.even(3) if old else None
    got, v, _ = fp.search(N, mu, s1, s2, nm, prev)
    L, D = GPT.layers, gpus
    lo_l, up_l, lo_g, up_g = fp.bounds(N, mu, s1)
    best = math.inf
    for ls in _compositions(L, N, lo_l, up_l):
        for gs in _compositions(D, N, lo_g, up_g):
            mp = Mapping(ls, gs)
            if fp.fits(mp, mu, s1):
                best = min(best, fp.pipeline_time(mp, s1, s2, nm, mu=mu) + fp.switch_time(prev, mp))
    assert v == pytest.approx(best, rel=1e-12)
    assert sum(got.layers) == L and sum(got.gpus) == D and fp.fits(got, mu, s1)


def test_stages_grow_with_sequence_length():
    fp = _planner(16)
    mus = (1024, 4096, 8192, 16384)
    ns = [fp.n_stage(mu, float(mu)) for mu in mus]
    assert ns == sorted(ns) and ns[-1] > ns[0]
    for mu, n in zip(mus, ns):
        assert fp.fits(fp.even(n), mu, float(mu)) or fp.o_plan(fp.even(n), mu, float(mu)) is not None
        if n > 1:
            assert not fp.fits(fp.even(n - 1), mu, float(mu))


def test_trigger_conditions():
    fp = _planner(16)
    s = lambda mu: (float(mu), float(mu) ** 2)  # noqa: E731
    first = fp.decide(2048, *s(2048), 8, None)
    assert first.action == "grow" and fp.fits(first.mapping, 2048, 2048.0)
    same = fp.decide(2048, *s(2048), 8, first.mapping)
    assert same.action == "keep" and same.mapping == first.mapping and same.switch_time == 0  # A and B
    long = fp.decide(32768, *s(32768), 8, first.mapping)  # not A: recompute (C and D) or grow
    assert long.action in ("memopt", "grow")
    if long.action == "memopt":
        assert long.mapping == first.mapping and any(long.recompute)
    else:
        assert long.mapping.stages > first.mapping.stages and long.switch_time > 0
    # fits (A): shrink (4) exactly when the new mapping plus its migration beats the current one (not B);
    # micro-batches of 16 short documents split well over a stage's GPUs, so 2 wide stages beat 8 narrow ones
    args = (2048, 16 * 2048.0, 16 * 2048.0 ** 2, 8)
    for host_bw in (32e9, 1e15):
        fq = FlexPipePlanner(fp.cost_model, host_bw=host_bw)
        back = fq.decide(*args, fq.even(8))
        _, v, _ = fq.search(fq.n_stage(2048, args[1]), *args, fq.even(8))
        assert back.action == ("shrink" if v < fq.pipeline_time(fq.even(8), *args[1:], mu=2048) else "keep")
        if host_bw > 1e12:  # free migration
            assert back.action == "shrink" and back.mapping.stages < 8


def test_switch_time_counts_new_layers():
    fp = _planner(4)
    a, b = Mapping((8, 8), (2, 2)), Mapping((4, 12), (2, 2))
    assert fp.switch_time(a, a) == 0 and fp.switch_time(None, a) == 0
    # GPUs 2, 3 held layers 8..15 and now hold 4..15: 4 new layers of 16 B per parameter over host_bw
    assert fp.switch_time(a, b) == pytest.approx(4 * GPT.layer_params() * 16 / fp.host_bw)
