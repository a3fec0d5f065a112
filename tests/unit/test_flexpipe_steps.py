"""FlexPipe in `tidal train` (decision 91): HBSA's mapping translated into the executor's candidates and step plans,
and the per-rank reconfiguration accounting (which groups moved, their bytes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tidal.baselines.flexpipe import FlexPipePlanner
from tidal.baselines.flexpipe_steps import (
    FlexPipeStepPlanner,
    candidate_index,
    flexpipe_candidates,
    layer_splits,
    parse_depths,
    reconfigurations,
    strategy_for,
)
from tidal.core import get_cluster, get_model
from tidal.core.errors import TidalError
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.runtime.config import PlannerConfig
from tidal.runtime.reconfig import moved_groups, reconfig_stats


def test_layer_splits_within_hbsa_bounds():
    assert layer_splits(6, 1) == [(6,)]
    assert layer_splits(6, 2) == [(3, 3)]
    s4 = layer_splits(6, 4)
    assert len(s4) == 10 and all(sum(s) == 6 and min(s) >= 1 and max(s) <= 3 for s in s4)
    assert len(set(s4)) == 10
    assert layer_splits(32, 4) == [(8, 8, 8, 8)]
    assert layer_splits(3, 4) == []


def test_strategy_layout_and_uneven_split_on_tiny():
    spec = get_model("tiny")
    st = strategy_for(4, (1, 2, 2, 1), 8)
    assert [p.devices for p in st.pipelines] == [(0, 2, 4, 6), (1, 3, 5, 7)]  # a stage's replicas are adjacent
    for p in st.pipelines:
        p.scheme.validate(spec)
        assert p.scheme.stage_layers(6) == (1, 2, 2, 1)
    assert str(strategy_for(1, (6,), 8)) == "8*tp1"
    assert len(strategy_for(3, (2, 2, 2), 8).pipelines) == 2  # 8 // 3 pipelines, 2 devices idle
    with pytest.raises(TidalError):
        strategy_for(4, (2, 2, 1, 1), 3)


def test_candidates_cover_every_choice():
    cands = flexpipe_candidates(6, 8, (1, 2, 4))
    assert len(cands) == 1 + 1 + 10
    for split in layer_splits(6, 4):
        k = candidate_index(cands, 4, split)
        assert cands[k].pipelines[0].scheme.stage_layers(6) == split
    assert cands[candidate_index(cands, 1, (6,))].pipelines[0].scheme.pp == 1
    with pytest.raises(TidalError):
        candidate_index(cands, 3, (2, 2, 2))
    assert len(flexpipe_candidates(6, 8)) == 19  # every depth 1..6
    with pytest.raises(TidalError):
        flexpipe_candidates(6, 8, (7,))


def test_config_and_depths():
    assert parse_depths("") == () and parse_depths("1,2,4") == (1, 2, 4)
    for bad in ("1,x", "0,2"):
        with pytest.raises(TidalError):
            parse_depths(bad)
    with pytest.raises(TidalError):
        PlannerConfig(name="megatron")
    with pytest.raises(TidalError):
        PlannerConfig(flexpipe_depths="1,2")  # needs name = "flexpipe"
    assert PlannerConfig().name == "tidal"


@dataclass
class _Step:
    seq_ids: np.ndarray
    lengths: np.ndarray
    doc_ids: np.ndarray
    starts: np.ndarray


class _Source:
    def __init__(self, steps):
        self.steps, self.i = steps, 0

    def next_step(self):
        if self.i >= len(self.steps):
            return None
        self.i += 1
        lens = np.asarray(self.steps[self.i - 1])
        n = len(lens)
        return _Step(np.arange(n) + 100 * self.i, lens, np.arange(n), np.zeros(n, dtype=np.int64))

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, d):
        self.i = d["i"]


def _planner(steps, depths=()):
    cm = AnalyticCostModel(get_model("tiny"), get_cluster("cpux8"))
    cands = flexpipe_candidates(6, 8, depths)
    return FlexPipeStepPlanner(FlexPipePlanner(cm), cands, _Source(steps), depths, 512), cands


def test_step_plans_translate_the_decision():
    steps = [[300, 20, 50, 7, 90, 120, 5, 64, 33, 2], [512, 3], [40] * 9]
    pl, cands = _planner(steps, (1, 4, 2))
    seen = []
    for want in (1, 4, 2):
        ps = pl.next()
        plan = ps.plan
        strat = cands[plan.strategy]
        assert strat.pipelines[0].scheme.pp == want and pl.choices[-1].depth == want
        assert [p.devices for p in plan.pipelines] == [p.devices for p in strat.pipelines]
        assert all(p.layer_split == s.scheme.layer_split for p, s in zip(plan.pipelines, strat.pipelines))
        ran = sorted(i for p in plan.pipelines for mb in p.micro_batches for i in mb)
        assert ran == list(range(len(plan.seq_lengths)))  # every sequence exactly once, none deferred
        assert all(len(p.micro_batches) <= max(p.pp, 2) for p in plan.pipelines)
        seen.append(plan.strategy)
    assert pl.next() is None
    assert reconfigurations(pl.choices) == 2
    state = pl.state_dict()
    pl2, _ = _planner(steps, (1, 4, 2))
    pl2.load_state_dict(state)
    assert pl2.current == pl.current and pl2.next() is None


def test_hbsa_keeps_one_stage_when_everything_fits():
    pl, cands = _planner([[100, 50], [256, 8], [30] * 5])
    for _ in range(3):
        ps = pl.next()
        assert cands[ps.plan.strategy].pipelines[0].scheme.pp == 1
    assert [c.action for c in pl.choices] == ["grow", "keep", "keep"]
    assert reconfigurations(pl.choices) == 0


def test_moved_groups_skip_unchanged_boxes():
    a = {0: ((0, 8), (0, 4))}
    b = {0: ((8, 16), (0, 4))}  # another TP shard of the same tensor
    assert moved_groups(None, [a, {}, b]) == [0, 2]  # first step: everything held is new
    assert moved_groups([a, b, {}], [a, b, {}]) == []  # same holder, same shard
    assert moved_groups([a, {}, {}], [b, a, {}]) == [0, 1]  # other shard; gained a group
    assert moved_groups([a, b, a], [a, {}, {}]) == []  # dropping groups moves nothing


@dataclass
class _Stats:
    send: int
    recv: int


@dataclass
class _View:
    dst_box: dict


class _Plan:
    def __init__(self, box, send, recv, rank=0):
        self.box, self.stats = box, {rank: _Stats(send, recv)}

    def rank_view(self, rank):
        return _View({0: self.box} if self.box else {})


def test_reconfig_stats_bytes():
    full, half = ((0, 10), (0, 4)), ((0, 5), (0, 4))
    old = [([0], _Plan(full, 4, 36)), ([1], _Plan(None, 8, 0))]
    new = [([0], _Plan(half, 4, 16)), ([1], _Plan(full, 4, 36))]
    assert reconfig_stats([old, new], None, 1, 0, 2).reconfigured is False
    assert reconfig_stats([old, new], 1, 1, 0, 2).moved_groups == 0
    st = reconfig_stats([old, new], 0, 1, 0, 2)
    assert st.reconfigured and st.moved_groups == 2  # group 0: another box; group 1: gained
    assert st.moved_recv_bytes == 16 + 36 and st.moved_param_bytes == (20 + 40) * 2
    assert st.extra_bytes == (20 + 40) - (40 + 8)
