"""The repair pass (passes.repair_pass, planner/repair.py, decision 134) under the pass protocol: it runs only on
plans whose every pipeline is one-stage, returns a checked plan (each document once, no empty micro-batch, each
<= MaxLen) timed as the packer times it, never slower than its input; turned off, plans are byte-identical whatever
its knobs."""

import dataclasses
import json

import numpy as np
import pytest
from planner_synth import PROFILES, check_plan

from tidal.planner.config import PASS_ORDER, PROPOSAL, PlannerConfig
from tidal.planner.packing import pack
from tidal.planner.passes import PASSES, Allowance, Context, pack_groups
from tidal.planner.select import select_step

pytestmark = pytest.mark.unit

OFF = PlannerConfig(passes=tuple(p for p in PASS_ORDER if p != "repair"))


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
    check_plan(l_, prof, on.plan.est_step_time, on.plan.pipelines)
    # the cheap preset (the strategy proposal's planner) runs no pass, so no repair either
    assert "repair" not in PROPOSAL.passes


def test_repair_spends_only_when_it_repacked():
    l_ = np.random.default_rng(2).integers(20, 81, size=60).astype(np.int64)
    rp, left = PASSES["repair"], Allowance.for_step(PlannerConfig())
    prof, l_ = PROFILES[0], l_[:10]  # 2*tp4 (MaxLen 400): each pipeline in one micro-batch, nothing to repack
    est, plans = pack_groups(l_, prof, [list(range(0, 10, 2)), list(range(1, 10, 2))], pack, False)
    assert all(len(p.micro_batches) == 1 for p in plans)
    ctx = Context(l_, prof, pack, 0, 0.0, None, PlannerConfig(), 0.0)
    assert rp.run(ctx, est, plans, left) is None and left.left("repair")
