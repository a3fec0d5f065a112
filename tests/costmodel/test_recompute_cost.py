"""Recomputation in the memory and cost models (costmodel/memory.py, costmodel/recompute.py; decision 90)."""

import dataclasses

import numpy as np
import pytest

from tidal.core import TidalError, get_cluster, get_model
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import default_cost_model
from tidal.costmodel.memory import MemoryConfig, executor_memory, layer_act_bytes, stage_memory
from tidal.costmodel.recompute import RecomputeCostModel
from tidal.planner.stepper import build_candidates

pytestmark = pytest.mark.unit


def _cm():
    return default_cost_model(get_model("llama2-7b"), get_cluster("a800x16"))


def test_none_answers_what_the_base_does():
    cm = _cm()
    dev = cm.cluster.groups[0].device
    wrapped = RecomputeCostModel(cm, "none")
    for mem in (cm.memory, executor_memory("bfloat16", "float32")):
        base = dataclasses.replace(cm, memory=mem)
        for t, p, c in ((1, 1, 1), (2, 2, 1), (4, 1, 2), (8, 2, 2)):
            s = ParallelScheme(t, p, c)
            assert dataclasses.replace(wrapped, base=base).max_len(s, dev) == base.max_len(s, dev)
            assert wrapped.coeffs(s, dev) == cm.coeffs(s, dev)


def test_activation_bytes_per_mode():
    m, cfg = get_model("llama2-7b"), MemoryConfig()
    full_a = (36.0 / 2 + 1.25) * m.hidden
    assert layer_act_bytes(m, cfg, 2, "none") == (full_a, 0.0)
    assert layer_act_bytes(m, cfg, 2, "selective") == (full_a - 4.0 * m.heads / 2, 0.0)
    assert layer_act_bytes(m, cfg, 2, "full") == (2.0 * m.hidden, full_a)
    s = ParallelScheme(2, 2, 1)
    tok = 4096
    none = stage_memory(m, s, 16, tok, cfg)
    full = stage_memory(m, s, 16, tok, dataclasses.replace(cfg, recompute="full"))
    per_stage = dataclasses.replace(cfg, recompute="full,none")  # stage 0 recomputes, stage 1 does not
    mixed = stage_memory(m, s, 16, tok, per_stage)
    L = m.layers // 2
    assert none[0] - full[0] == pytest.approx(tok * (full_a * L * 2 - 2.0 * m.hidden * L * 2 - full_a))
    assert mixed[0] == pytest.approx(full[0]) and mixed[1] == pytest.approx(none[1])
    with pytest.raises(TidalError, match="recompute mode must be one of"):
        MemoryConfig(recompute="most")


def test_recompute_raises_max_len_and_charges_the_extra_forward():
    cm = _cm()
    dev = cm.cluster.groups[0].device
    s = ParallelScheme(1, 1, 1)
    lens = [RecomputeCostModel(cm, m).max_len(s, dev) for m in ("none", "selective", "full")]
    assert lens[0] <= lens[1] < lens[2] and lens[2] > 5 * lens[0]
    base, full, sel = cm.coeffs(s, dev), RecomputeCostModel(cm, "full").coeffs(s, dev), \
        RecomputeCostModel(cm, "selective").coeffs(s, dev)
    assert full.a == pytest.approx(base.a * 4 / 3) and full.b == pytest.approx(base.b * 4 / 3)
    assert sel.a == pytest.approx(base.a * 4 / 3) and sel.b == base.b


def test_auto_recomputes_only_where_the_length_needs_it_and_the_planner_admits_it():
    cm = _cm()
    dev = cm.cluster.groups[0].device
    need = 30000
    auto = RecomputeCostModel(cm, "auto", need=need)
    assert auto.modes(ParallelScheme(4, 1, 1), dev) == ("none",)  # holds 41355 tokens as it is
    assert auto.modes(ParallelScheme(2, 2, 1), dev) == ("full", "full")
    assert auto.max_len(ParallelScheme(2, 2, 1), dev) >= need
    with pytest.raises(TidalError, match="exceeds the MaxLen of every scheme"):
        build_candidates(cm, "8*tp2", None, tokens_per_step=65536, max_len=need, seed=0)
    cands = build_candidates(auto, "8*tp2", None, tokens_per_step=65536, max_len=need, seed=0)
    assert [p.scheme.tp for p in cands[0].pipelines] == [2] * 8
    sample = np.array([need] * 4 + [2000] * 60)
    assert build_candidates(auto, "auto", sample, tokens_per_step=4 * need, max_len=need, seed=0)
    with pytest.raises(TidalError, match="needs the length"):
        RecomputeCostModel(cm, "auto")


def test_tidal_train_plans_with_the_configured_recompute():
    from tidal.runtime.config import TrainConfig
    from tidal.runtime.train import build_cost_model

    cfg, cl = TrainConfig(), get_cluster("cpux4")
    s, dev = ParallelScheme(1, 2, 1), cl.groups[0].device

    def ml(recompute):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, recompute=recompute))
        return build_cost_model(c, get_model("tiny"), cl).max_len(s, dev)

    assert ml("none") < ml("selective,full") < ml("full")


def test_tidal_train_auto_recompute_picks_modes_per_scheme():
    """`[train] recompute = "auto"`: each candidate scheme runs the cheapest mode that holds [data] max_len; the
    planner's MaxLen (here and in the background planner's memory config), the executor and the rows agree."""
    from tidal.runtime.config import DataConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
    from tidal.runtime.train import build_cost_model, planner_spec, prepare

    def cfg(recompute, max_len, strategies="tp1pp2+tp2;2*tp1pp2"):
        return TrainConfig(world=WorldConfig("cpux4"), data=DataConfig("random:synthetic:github", max_len, 4 * max_len),
                           planner=PlannerConfig(strategies),
                           train=TrainSection(2, recompute=recompute, compute_dtype="bfloat16"))

    spec, cl = get_model("tiny"), get_cluster("cpux4")
    dev = cl.groups[0].device
    base = build_cost_model(cfg("none", 1000), spec, cl)
    need = base.max_len(ParallelScheme(1, 2, 1), dev) + 1  # tp1pp2 cannot hold it as it is; tp2 can
    assert base.max_len(ParallelScheme(2, 1, 1), dev) >= need
    with pytest.raises(TidalError, match="exceeds the MaxLen"):
        prepare(cfg("none", need, "2*tp1pp2"), 4)
    job = prepare(cfg("auto", need), 4)
    table = dict(job.exec_config.recompute_schemes)
    assert table["tp1pp2cp1"] in (("selective",) * 2, ("full",) * 2) and table["tp2pp1cp1"] == ("none",)
    assert job.exec_config.stage_recompute(ParallelScheme(1, 2, 1), 1) == table["tp1pp2cp1"][1]
    assert planner_spec(job).memory.recompute == ("auto",)
    cm = job.cost_model()
    assert cm.max_len(ParallelScheme(1, 2, 1), dev) >= need
    assert cm.coeffs(ParallelScheme(1, 2, 1), dev).a > base.coeffs(ParallelScheme(1, 2, 1), dev).a
    assert cm.coeffs(ParallelScheme(2, 1, 1), dev) == base.coeffs(ParallelScheme(2, 1, 1), dev)
