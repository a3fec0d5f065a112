"""The per-step time budget: a plan cut short is valid, its bound proven and its gap reported; a budget that is not
reached changes nothing; the CLI flag reaches the planner."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_synth import PROFILES
from test_planner_invariants import SETTINGS, cands_st, check_step, lengths_st

from tidal.planner.select import select_step

pytestmark = pytest.mark.unit


@settings(max_examples=400, **SETTINGS)
@given(lengths=lengths_st, cands=cands_st, seed=st.integers(0, 3))
def test_invariants_with_budget_on_and_off(lengths, cands, seed):
    profiles = [PROFILES[k] for k in cands]
    if lengths and max(lengths) > max(p.max_len for p in profiles):
        return
    cut = select_step(lengths, profiles, seed=seed, budget_ms=0.0)  # always past the deadline
    check_step(lengths, profiles, cut.plan)
    off = select_step(lengths, profiles, seed=seed)
    on = select_step(lengths, profiles, seed=seed, budget_ms=60_000.0)  # never reached
    check_step(lengths, profiles, on.plan)
    assert not on.cut_short and not off.cut_short
    assert json.dumps(on.plan.to_dict(timings=False)) == json.dumps(off.plan.to_dict(timings=False))
    assert cut.plan.lower_bound <= off.plan.est_step_time  # the cut plan's bound is still a bound


def test_cut_plan_on_a_large_step_is_valid_and_reports_its_gap():
    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel import default_cost_model
    from tidal.planner.select import profile_strategies

    model, cluster = get_model("llama2-7b"), get_cluster("a800x64")
    cands = [place(parse_strategy(s), cluster, model) for s in ("16*tp4", "2*tp8+12*tp4", "4*tp4+24*tp2", "8*tp4pp2")]
    profiles = profile_strategies(cands, default_cost_model(model, cluster))
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(6.5, 1.4, 400), 1, 32768).astype(np.int64)
    cut = select_step(lengths, profiles, budget_ms=0.0)
    full = select_step(lengths, profiles)
    assert cut.cut_short and not full.cut_short
    check_step(lengths, profiles, cut.plan)
    assert 0 < cut.plan.lower_bound <= full.plan.lower_bound
    assert sum(r.est_step_time is not None for r in cut.strategies) == 1  # only the first candidate was assigned
    assert cut.plan.est_step_time >= full.plan.est_step_time
    assert np.isfinite(cut.plan.est_step_time / cut.plan.lower_bound)


def test_cli_budget_flag(tmp_path):
    from tidal.cli.main import main
    from tidal.core import Plan

    out = tmp_path / "p.json"
    assert main(["plan", "--model", "llama2-7b", "--cluster", "a800x16", "--tokens-per-step", "60000", "--max-len",
                 "16384", "--steps", "2", "--quiet", "--strategies", "4*tp4;2*tp8", "--plan-budget-ms", "0",
                 "--json", str(out)]) == 0
    for s in Plan.load(out).steps:
        assert s.est_step_time >= s.lower_bound > 0
        assert sorted(i for p in s.pipelines for mb in p.micro_batches for i in mb) == list(range(len(s.seq_ids)))
