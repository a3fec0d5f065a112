"""The passes that rework a one-stage plan's micro-batches (repair, decision 134; exchange, decision 136), alone
after a bare assign on random steps: a checked plan (every document once, none over MaxLen, times recomputed the
planner's way), never slower than the bare plan; on a multi-stage plan neither runs nor spends its allowance."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from planner_synth import PROFILES, check_plan, one_stage_cases

from tidal.planner.config import PlannerConfig
from tidal.planner.packing import pack
from tidal.planner.passes import PASSES, Allowance, Context, pack_groups
from tidal.planner.select import assign

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["repair", "exchange"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=one_stage_cases())
def test_one_stage_pass_returns_a_checked_plan_never_slower(name, case):
    prof, l_ = case
    bare = assign(l_, prof, fallback=False, config=PlannerConfig(passes=()))
    est, plans = assign(l_, prof, fallback=False, config=PlannerConfig(passes=(name,)))  # target 0: the gap allows it
    assert est <= bare[0]
    check_plan(l_, prof, est, plans)


@pytest.mark.parametrize("name", ["repair", "exchange"])
def test_one_stage_pass_skips_multi_stage_plans(name):
    l_ = np.random.default_rng(2).integers(20, 81, size=60).astype(np.int64)
    prof = PROFILES[2]  # 2*tp2pp2
    est, plans = pack_groups(l_, prof, [list(range(0, 60, 2)), list(range(1, 60, 2))], pack, False)
    left = Allowance.for_step(PlannerConfig())
    before = left.counts[name]
    ctx = Context(l_, prof, pack, 0, 0.0, None, PlannerConfig(), 0.0)
    assert PASSES[name].run(ctx, est, plans, left) is None and left.counts[name] == before > 0
