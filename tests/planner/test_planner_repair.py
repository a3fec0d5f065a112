"""The repair pass (passes.RepairPass, planner/repair.py, decision 134) under the pass protocol: it runs only on
plans whose every pipeline is one-stage, returns a checked plan (each document once, no empty micro-batch, each
<= MaxLen) timed as the packer times it, never slower than its input; turned off, plans are byte-identical whatever
its knobs."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_synth import PROFILES, step_lengths

from tidal.planner.config import PASS_ORDER, PROPOSAL, PlannerConfig
from tidal.planner.packing import pack, pipeline_time
from tidal.planner.passes import Allowance, Context, RepairPass, pack_groups
from tidal.planner.select import assign, select_step

pytestmark = pytest.mark.unit

ONE_STAGE = (0, 1, 3)  # 2*tp4, tp4+2*tp2, tp2cp2+4*tp1
OFF = PlannerConfig(passes=tuple(p for p in PASS_ORDER if p != "repair"))
ONLY = PlannerConfig(passes=("repair",))


def _checked(l_, prof, est, plans):
    assert est == max(p.est_time for p in plans)
    assert sorted(i for p in plans for mb in p.micro_batches for i in mb) == list(range(l_.size))
    lf = l_.astype(np.float64)
    for p, pc in zip(plans, prof.pipes):
        assert all(len(mb) and int(l_[list(mb)].sum()) <= pc.max_len for mb in p.micro_batches)
        assert p.est_time == pipeline_time(lf, p.micro_batches, pc.coeffs, pc.pp)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ONE_STAGE).flatmap(lambda k: step_lengths(80, PROFILES[k].max_len).map(
    lambda ls: (PROFILES[k], np.asarray(ls, dtype=np.int64)))))
def test_repair_pass_returns_a_checked_plan_never_slower(case):
    prof, l_ = case
    bare = assign(l_, prof, fallback=False, config=PlannerConfig(passes=()))
    est, plans = assign(l_, prof, fallback=False, config=ONLY)  # target 0: the pass's gap always allows it
    assert est <= bare[0]
    _checked(l_, prof, est, plans)


@pytest.mark.parametrize("k,seed,short", [(3, 5, False), (1, 4, True)])
def test_repair_gains_on_these_steps_and_off_is_byte_identical(k, seed, short):
    prof = PROFILES[k]
    rng = np.random.default_rng(seed)
    l_ = np.minimum(np.ceil(rng.lognormal(3.0, 0.9, 300)), prof.max_len).astype(np.int64)
    if short:  # 60 documents of 20-80 tokens (the second draw of this generator)
        l_ = rng.integers(20, 81, size=60).astype(np.int64)

    def plan(cfg):
        return json.dumps(select_step(l_, [prof], config=cfg).plan.to_dict(timings=False), sort_keys=True)

    off = plan(OFF)
    # the repair's knobs do not reach the plan while it is off, nor when its allowance is 0
    assert plan(dataclasses.replace(OFF, repair_excess=0.5, repair_moves=1, repair_gap=0.0)) == off
    assert plan(dataclasses.replace(PlannerConfig(), repair_per_step=0)) == off
    on = select_step(l_, [prof])
    assert on.plan.est_step_time < select_step(l_, [prof], config=OFF).plan.est_step_time
    _checked(l_, prof, on.plan.est_step_time, on.plan.pipelines)
    # the cheap preset (the strategy proposal's planner) runs no pass, so no repair either
    assert "repair" not in PROPOSAL.passes


def test_repair_skips_multi_stage_plans_and_spends_only_when_it_repacked():
    l_ = np.random.default_rng(2).integers(20, 81, size=60).astype(np.int64)
    rp = RepairPass()
    prof = PROFILES[2]  # 2*tp2pp2
    est, plans = pack_groups(l_, prof, [list(range(0, 60, 2)), list(range(1, 60, 2))], pack, False)
    left = Allowance.for_step(PlannerConfig())
    ctx = Context(l_, prof, pack, 0, 0.0, None, PlannerConfig(), 0.0)
    assert rp.run(ctx, est, plans, left) is None and left.left("repair")
    prof, l_ = PROFILES[0], l_[:10]  # 2*tp4 (MaxLen 400): each pipeline in one micro-batch, nothing to repack
    est, plans = pack_groups(l_, prof, [list(range(0, 10, 2)), list(range(1, 10, 2))], pack, False)
    assert all(len(p.micro_batches) == 1 for p in plans)
    ctx = Context(l_, prof, pack, 0, 0.0, None, PlannerConfig(), 0.0)
    assert rp.run(ctx, est, plans, left) is None and left.left("repair")
