"""The pass protocol and its one rule (passes.improve, decision 95): a pass runs only while the plan is above the bound
by more than its gap, the candidate can still beat the incumbent, the deadline allows and its allowance is left; its
result is kept only if strictly faster; passes run in the configured order."""

import time

import numpy as np
import pytest
from planner_synth import PROFILES

from tidal.planner.config import PASS_ORDER, PlannerConfig
from tidal.planner.packing import pack
from tidal.planner.passes import PASSES, Allowance, Context, improve
from tidal.planner.select import assign

pytestmark = pytest.mark.unit


class Fake:
    """A pass that returns a fixed estimate (its plans are a marker), records its calls, spends one if asked."""

    def __init__(self, name: str, result: float | None, gap: float = 0.0, spend: bool = False):
        self.name, self.result, self._gap, self.spend, self.calls = name, result, gap, spend, []

    def gap(self, ctx):
        return self._gap

    def run(self, ctx, est, plans, left):
        self.calls.append(est)
        if self.spend:
            left.spend(self.name)
        return None if self.result is None else (self.result, (self.name,))


def _ctx(passes, target=1.0, deadline=None):
    return Context(np.array([5, 7], dtype=np.int64), PROFILES[0], pack, 0, target, deadline,
                   PlannerConfig(passes=passes), 0.0)


LATE, SHRINK, POLISH, FILL, REPAIR, EXCHANGE = PASS_ORDER  # the passes, in their order
TWO = (LATE, FILL)


def test_kept_only_if_faster_in_order():
    table = {LATE: Fake(LATE, 1.5), FILL: Fake(FILL, 1.2)}
    est, plans = improve(_ctx(TWO), 2.0, ("first",), Allowance(), passes=table)
    assert (est, plans) == (1.2, (FILL,))
    assert table[LATE].calls == [2.0] and table[FILL].calls == [1.5]  # the second sees the first's result
    table = {LATE: Fake(LATE, 1.5), FILL: Fake(FILL, 1.7)}  # a slower result is discarded
    assert improve(_ctx(TWO), 2.0, ("first",), Allowance(), passes=table) == (1.5, (LATE,))
    # a pass that returns None or an equal plan changes nothing
    table = {LATE: Fake(LATE, 2.0), FILL: Fake(FILL, None)}
    assert improve(_ctx(TWO), 2.0, ("first",), Allowance(), passes=table) == (2.0, ("first",))


def test_only_configured_passes_run():
    table = {n: Fake(n, 0.5) for n in PASS_ORDER}
    improve(_ctx((SHRINK,)), 2.0, (), Allowance(), passes=table)
    assert [n for n, p in table.items() if p.calls] == [SHRINK]
    table = {n: Fake(n, 0.5) for n in PASS_ORDER}
    assert improve(_ctx(()), 2.0, (), Allowance(), passes=table)[0] == 2.0
    assert not any(p.calls for p in table.values())


def test_skipped_under_its_gap_and_when_the_bound_cannot_beat_the_incumbent():
    late, fill = Fake(LATE, 1.0, gap=0.01), Fake(FILL, 1.0, gap=0.02)
    ctx = _ctx(TWO)
    # 1.015 x the bound: above the 1 % gap, under the 2 % one
    assert improve(ctx, 1.015, ("first",), Allowance(), passes={LATE: late, FILL: fill})[0] == 1.0
    assert late.calls == [1.015] and fill.calls == []
    late2 = Fake(LATE, 1.0)
    assert improve(ctx, 1.5, (), Allowance(), beat=1.0, passes={LATE: late2, FILL: fill})[0] == 1.5
    assert late2.calls == [] and fill.calls == []  # target 1.0 is not below the incumbent's 1.0


def test_allowance_is_spent_and_then_skips():
    late, fill = Fake(LATE, None, spend=True), Fake(FILL, None, spend=True)
    table = {LATE: late, FILL: fill}
    left = Allowance({FILL: 2})  # late_restarts is not named: no limit
    for _ in range(4):
        improve(_ctx(TWO), 2.0, (), left, passes=table)
    assert len(fill.calls) == 2 and len(late.calls) == 4 and not left.left(FILL) and left.left(LATE)
    assert Allowance().left(FILL)  # None: no limit at all
    step = Allowance.for_step(PlannerConfig())
    assert set(step.counts) == {LATE, SHRINK, FILL, REPAIR, EXCHANGE}  # polish has no allowance


def test_deadline_passed_runs_nothing():
    fill = Fake(FILL, 0.5)
    assert improve(_ctx((FILL,), deadline=time.perf_counter() - 1), 2.0, (), Allowance(),
                   passes={FILL: fill})[0] == 2.0
    assert fill.calls == []


def test_every_pass_follows_the_protocol():
    assert tuple(PASSES) == PASS_ORDER
    ctx = _ctx(PASS_ORDER)
    for p in PASSES.values():
        assert p.name in PASS_ORDER and 0 <= p.gap(ctx) < 1


def test_assign_spends_the_step_allowance():
    """One late-restart attempt per step (PlannerConfig.late_per_step = 1), as select_step shares it between its
    candidates: the first assign on a step above restart_max spends it, and a second assign with the same allowance
    plans exactly as without the pass."""
    prof = PROFILES[3]  # tp2cp2+4*tp1: 5 pipelines
    rng = np.random.default_rng(5)
    l_ = np.minimum(np.ceil(rng.lognormal(3.0, 0.9, 300)), prof.max_len).astype(np.int64)
    assert l_.size * len(prof.pipes) > PlannerConfig().restart_max
    left = Allowance.for_step(PlannerConfig())
    assign(l_, prof, allowance=left, fallback=False, config=PlannerConfig(passes=(LATE,)))
    assert not left.left(LATE)  # target 0: every plan is above it, so the one attempt was spent
    bare = assign(l_, prof, fallback=False, config=PlannerConfig(passes=()))
    assert assign(l_, prof, allowance=left, fallback=False, config=PlannerConfig(passes=(LATE,))) == bare


@pytest.mark.parametrize("name", PASS_ORDER)
def test_each_pass_alone_is_never_worse(name):
    """assign with one pass against no pass on a few random steps, with the candidate's bound as target (the passes
    that need a bound run)."""
    from tidal.planner.bounds import strategy_bound

    rng = np.random.default_rng(7)
    for k in (3, 4, 6):
        prof = PROFILES[k]
        l_ = np.minimum(np.ceil(rng.lognormal(3.0, 0.9, 300)), prof.max_len).astype(np.int64)
        t = strategy_bound(l_, prof.pipes)
        bare = assign(l_, prof, target=t, fallback=False, config=PlannerConfig(passes=()))[0]
        est, plans = assign(l_, prof, target=t, fallback=False, config=PlannerConfig(passes=(name,)))
        assert est <= bare and est == max(p.est_time for p in plans)
        assert sorted(i for p in plans for mb in p.micro_batches for i in mb) == list(range(l_.size))
        for p in plans:
            for mb in p.micro_batches:
                assert int(l_[list(mb)].sum()) <= p.max_len
