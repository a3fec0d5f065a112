"""The compared systems on one small workload: same data, every sequence run exactly once, sane configurations."""

import numpy as np
import pytest

from tidal.core.cluster import get_cluster
from tidal.core.model import get_model
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.data.sampler import TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator import baselines
from tidal.simulator.systems import SYSTEMS, Workload, run_system, speedups

pytestmark = pytest.mark.unit


def _workload(cluster="a800x16", max_len=16384, tokens=60000, steps=2, data="synthetic:commoncrawl"):
    cm = AnalyticCostModel(get_model("llama2-7b"), get_cluster(cluster))
    return Workload(cm, max_len, tokens, steps, 0,
                    lambda: TokenBudgetSampler(length_source(data, 0), tokens, max_len, seed=0),
                    length_source(data, 0).lengths(0, 5000))


@pytest.fixture(scope="module")
def runs():
    w = _workload()
    return {name: run_system(name, w) for name in SYSTEMS}


def test_same_tokens_every_system(runs):
    totals = {n: sum(r.tokens) for n, r in runs.items()}
    assert len(set(totals.values())) == 1, totals
    for r in runs.values():
        assert len(r.strategies) == len(r.steps) == len(r.tokens)
        assert all(t > 0 for t in r.step_times)


def test_every_sequence_runs_once():
    w = _workload()
    for cfg in baselines.configs(w.cost_model, w.max_len)[:5]:
        lens = np.asarray(w.source_factory().next_step().lengths)
        plan = baselines.static_plan(lens, cfg)
        ran = sorted(i for p in plan.pipelines for mb in p.micro_batches for i in mb)
        assert ran == list(range(lens.size))
        for p in plan.pipelines:
            assert all(sum(lens[list(mb)]) <= w.max_len for mb in p.micro_batches)
            assert len(p.devices) == p.tp * p.pp * p.cp


def test_baseline_configurations(runs):
    assert runs["deepspeed"].config.startswith("ulysses sp")
    assert "cp" not in runs["hydraulis"].config  # Hydraulis fixes CP = 1
    assert runs["hotspa"].config.count("<=") == 2  # App. G: two strategies (<4K, 4K-16K) at a 16K context
    assert all(len(set(r.strategies)) == 1 for n, r in runs.items() if n in ("megatron", "deepspeed"))


def test_homogeneous_search_is_feasible_and_complete():
    w = _workload()
    cfgs = baselines.homogeneous(w.cost_model, w.max_len)
    dev = w.cost_model.cluster.device_type(0)
    assert cfgs and all(s.num_devices * dp == 16 for s, dp, _ in cfgs)
    assert all(w.cost_model.max_len(s, dev) >= w.max_len for s, _, _ in cfgs)
    # Ulysses at 128K on 16 A800s: checkpointing exactly where ZeRO-3 alone does not fit, and the low degrees need it
    uly = baselines.homogeneous(w.cost_model, 131072, ulysses=True)
    z3 = baselines.Variant(w.cost_model, zero3=True)
    assert uly and any(ck for _, _, ck in uly)
    for s, _, ck in uly:
        assert ck == (z3.max_len(s, dev) < 131072)
        assert baselines.Variant(w.cost_model, recompute=ck, zero3=True).max_len(s, dev) >= 131072


def test_quality_tidal_beats_static(runs):
    sp = speedups(list(runs.values()))
    assert sp["tidal"] > 1.0 and sp["hydraulis"] > 1.0
    assert max(sp["megatron"], sp["deepspeed"]) == pytest.approx(1.0)


def test_truth_runs_the_planners_plans_on_a_model_they_do_not_see():
    """Workload.truth (decision 77): planners plan with the workload's cost model, the simulator executes on the truth
    (a baseline's checkpointing / ZeRO-3 carried over), so the estimates are unchanged and the step times are not."""
    from dataclasses import replace

    from tidal.core import TidalError

    w = _workload(steps=1)
    slow = AnalyticCostModel(w.cost_model.model, w.cost_model.cluster, replace(w.cost_model.eff, gemm=0.3))
    wt = replace(w, truth=slow)
    a, b = run_system("tidal", w), run_system("tidal", wt)
    assert a.strategies == b.strategies and a.est_times == b.est_times and a.config == b.config
    assert all(tb > 1.2 * ta for ta, tb in zip(a.step_times, b.step_times))
    assert all(t > 0 for t in run_system("deepspeed", wt).step_times)
    assert baselines.on_truth(w.cost_model, None) is w.cost_model
    v = baselines.Variant(w.cost_model, recompute=True, zero3=True)
    assert baselines.on_truth(v, slow) == baselines.Variant(slow, recompute=True, zero3=True)
    with pytest.raises(TidalError, match="another model or cluster"):
        baselines.on_truth(w.cost_model, AnalyticCostModel(get_model("llama2-13b"), w.cost_model.cluster))
