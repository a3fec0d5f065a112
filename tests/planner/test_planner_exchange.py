"""The exchange pass (passes.exchange_pass, planner/exchange.py, decision 136) under the pass protocol: it runs only on
plans whose every pipeline is one-stage, returns a checked plan (each document once, no empty micro-batch, each
<= MaxLen) timed as the packer times it, never slower than its input; turned off, plans are byte-identical whatever
its knobs; its knobs are validated."""

import dataclasses
import json

import numpy as np
import pytest
from planner_synth import ONE_STAGE, PROFILES, check_plan

from tidal.core.errors import TidalError
from tidal.planner.config import PASS_ORDER, PROPOSAL, PlannerConfig
from tidal.planner.packing import pack
from tidal.planner.passes import PASSES, Allowance, Context, pack_groups
from tidal.planner.select import select_step

pytestmark = pytest.mark.unit

OFF = PlannerConfig(passes=tuple(p for p in PASS_ORDER if p != "exchange"))


def _random_groups(rng, l_, prof):
    groups = [[] for _ in prof.pipes]
    for i, x in enumerate(l_.tolist()):
        groups[int(rng.choice([j for j, p in enumerate(prof.pipes) if x <= p.max_len]))].append(i)
    return groups


def test_exchange_pass_lowers_random_dispatches_and_spends_only_when_it_moved():
    """On packed random dispatches (slow plans) the pass makes moves, returns a faster checked plan and spends its
    allowance; on a plan it cannot improve it returns None and spends nothing."""
    rng = np.random.default_rng(3)
    p = PASSES["exchange"]
    gained = 0
    for k in ONE_STAGE:
        prof = PROFILES[k]
        l_ = np.minimum(np.ceil(rng.lognormal(3.0, 0.9, 120)), prof.max_len).astype(np.int64)
        est, plans = pack_groups(l_, prof, _random_groups(rng, l_, prof), pack, False)
        left = Allowance.for_step(PlannerConfig())
        ctx = Context(l_, prof, pack, 0, 0.0, None, PlannerConfig(), 0.0)
        res = p.run(ctx, est, plans, left)
        if res is not None:
            assert res[0] < est and left.counts["exchange"] == PlannerConfig().exchange_per_step - 1
            check_plan(l_, prof, *res)
            gained += 1
        else:
            assert left.left("exchange") and left.counts["exchange"] == PlannerConfig().exchange_per_step
    assert gained >= 2


def test_exchange_skips_large_steps():
    l_ = np.random.default_rng(2).integers(20, 81, size=60).astype(np.int64)
    p, left = PASSES["exchange"], Allowance.for_step(PlannerConfig())
    prof = PROFILES[0]
    est, plans = pack_groups(l_, prof, [list(range(60)), []], pack, False)  # all on one pipeline: a move helps
    small = dataclasses.replace(PlannerConfig(), exchange_max=l_.size * len(prof.pipes) - 1)
    assert p.run(Context(l_, prof, pack, 0, 0.0, None, small, 0.0), est, plans, left) is None
    assert p.run(Context(l_, prof, pack, 0, 0.0, None, PlannerConfig(), 0.0), est, plans, left)[0] < est


@pytest.mark.parametrize("k,seed", [(3, 5), (1, 4), (0, 9)])
def test_exchange_off_is_byte_identical(k, seed):
    prof = PROFILES[k]
    rng = np.random.default_rng(seed)
    l_ = np.minimum(np.ceil(rng.lognormal(3.0, 0.9, 300)), prof.max_len).astype(np.int64)

    def plan(cfg):
        return json.dumps(select_step(l_, [prof], config=cfg).plan.to_dict(timings=False), sort_keys=True)

    off = plan(OFF)
    # the exchange's knobs do not reach the plan while it is off, nor when its allowance is 0
    assert plan(dataclasses.replace(OFF, exchange_moves=1, exchange_partners=1, exchange_gap=0.0,
                                    exchange_depth=3)) == off
    assert plan(dataclasses.replace(PlannerConfig(), exchange_per_step=0)) == off
    on = select_step(l_, [prof])
    assert on.plan.est_step_time <= select_step(l_, [prof], config=OFF).plan.est_step_time
    check_plan(l_, prof, on.plan.est_step_time, on.plan.pipelines)
    assert "exchange" not in PROPOSAL.passes  # the cheap preset (the strategy proposal's planner) runs no pass


@pytest.mark.parametrize("field", ["exchange_cands", "exchange_partners", "exchange_depth"])
def test_exchange_knobs_are_validated(field):
    with pytest.raises(TidalError, match=field):
        PlannerConfig(**{field: 0})
    with pytest.raises(TidalError, match="exchange_moves"):
        PlannerConfig(exchange_moves=-1)
    with pytest.raises(TidalError, match="exchange_gap"):
        PlannerConfig(exchange_gap=1.5)
