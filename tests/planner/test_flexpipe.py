"""FlexPipe HBSA (flexpipe.txt Alg. 1): bounds, exact search within the bounds, memory, and trigger conditions."""

import itertools
import math
from dataclasses import replace

import pytest

from tidal.baselines.flexpipe import (
    FIG2C,
    TABLE2_MEMOPT_SHARE,
    FlexPipePlanner,
    Mapping,
    fig2c_times,
    fit_fig2c,
    fit_table2,
)
from tidal.core.cluster import GB, ClusterSpec, DeviceType, NodeGroup
from tidal.core.model import ModelSpec
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.memory import MEMORY_V1

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


def _paper_planner():
    """GPT (3.35B) on 16 A100s under FlexPipe's own memory model (Table 2 fit), Fig. 2(c)'s per-stage overhead and
    Table 2's largest O_plan share: `simulate_flexpipe.py --paper-setup`."""
    pl = FlexPipePlanner(AnalyticCostModel(GPT, ClusterSpec("t", (NodeGroup(A100, 16),))),
                         workload_memory=fit_table2(GPT))
    return pl, replace(pl, stage_overhead_s=fit_fig2c(pl), memopt_share=TABLE2_MEMOPT_SHARE)


def test_fig2c_overhead_reproduces_its_ratio_and_adds_per_stage_and_micro_batch():
    base, pl = _paper_planner()
    d = pl.stage_overhead_s
    assert d > 0
    length, g1, t1, g2, t2 = FIG2C
    a, b = fig2c_times(pl, (g1, g2))
    assert b / a == pytest.approx(t2 / t1, rel=1e-9)  # Fig. 2(c): 8 GPUs 7.08 s, 3 GPUs 4.7 s
    ts = fig2c_times(pl, range(3, 9))
    assert all(x < y for x, y in zip(ts, ts[1:]))  # beyond 3 GPUs, more GPUs lose on 3K samples (as Fig. 2(c))
    assert fig2c_times(base, (8,))[0] < fig2c_times(base, (3,))[0]  # without the overhead they win
    for mp, n in ((Mapping((5, 6, 5), (5, 5, 6)), 4), (Mapping((2, 3, 3, 3, 3, 2), (3, 2, 2, 3, 2, 4)), 7)):
        # Eq. 1 = sum t_i + (n - 1) max t_i: the overhead adds (stages + n_micro - 1) of itself, for any mapping
        grow = pl.pipeline_time(mp, 5000.0, 9e6, n, mu=3000) - base.pipeline_time(mp, 5000.0, 9e6, n, mu=3000)
        assert grow == pytest.approx((mp.stages + n - 1) * d, rel=1e-9)
    assert abs(TABLE2_MEMOPT_SHARE - 25 / 185) < 1e-12  # GPT (3.35B) at 512: 15 + 10 GB of 185 GB


def test_memopt_share_caps_the_memory_optimisation():
    base, pl = _paper_planner()
    mp = base.even(4)
    mus = [mu for mu in range(2048, 8193, 128) if base.o_plan(mp, mu) is not None and not base.fits(mp, mu)]
    assert mus  # some lengths overflow 4 stages and recomputation alone would hold them
    capped = [mu for mu in mus if pl.o_plan(mp, mu) is None]
    assert capped and capped != mus  # the cap refuses the larger overflows only
    for mu in mus:
        full = max(pl.stage_bytes(n, i, 4, pl.tokens(mu, 0.0, g)) for i, (n, g) in enumerate(zip(mp.layers, mp.gpus)))
        assert (pl.o_plan(mp, mu) is None) == ((full - pl.budget()) > pl.memopt_share * full)


def test_paper_setup_grows_for_a_long_iteration_and_shrinks_after_it():
    _, pl = _paper_planner()
    cur, acts = None, []
    for mu in (512, 512, 3072, 3072, 512):
        d = pl.decide(mu, float(mu), float(mu) ** 2, 4, cur)
        cur, acts = d.mapping, acts + [(d.action, d.mapping.stages)]
    (_, s0), _, (a2, s2), (a3, _), (a4, s4) = acts
    assert a2 == "grow" and s2 > s0 and a3 == "keep"
    assert a4 == "shrink" and s4 == s0  # fewer GPUs per pipeline win again on the short iteration


def test_capped_memopt_falls_back_to_full_recomputation_when_nothing_else_holds():
    """GPT (13B) on 32 A100s at 8K (simulate_flexpipe.py's largest cell): no even mapping holds it within Table 2's
    O_plan share, so the fewest stages and the decision take the uncapped recomputation instead of failing."""
    gpt13 = ModelSpec("gpt-13b", 40, 5120, 40, 40, 20480, 50257)
    pl = FlexPipePlanner(AnalyticCostModel(gpt13, ClusterSpec("t", (NodeGroup(A100, 32),))),
                         workload_memory=fit_table2(GPT), memopt_share=TABLE2_MEMOPT_SHARE)
    top = min(pl.D, gpt13.layers)
    assert all(pl.o_plan(pl.even(i), 8192) is None and not pl.fits(pl.even(i), 8192) for i in range(1, top + 1))
    n = pl.n_stage(8192)
    assert pl.o_plan(pl.even(n), 8192, capped=False) is not None
    assert pl.o_plan(pl.even(n - 1), 8192, capped=False) is None
    d = pl.decide(8192, 8192.0, 8192.0 ** 2, 4, None)
    assert any(d.recompute) and d.mapping.stages == n
