"""The passes that rework a one-stage plan's micro-batches (repair, decision 134; exchange, decision 136), alone
after a bare assign on random steps: a checked plan (every document once, none over MaxLen, times recomputed the
planner's way), never slower than the bare plan."""

import pytest
from hypothesis import HealthCheck, given, settings
from planner_synth import check_plan, one_stage_cases

from tidal.planner.config import PlannerConfig
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
