"""The next-best restarts of a small step are packed too (decision 64): the dispatch objective only bounds the packed
time, so the restart with the lowest objective is not always the fastest plan. What assign did before is unchanged
(they are packed last), so its plan is never slower; on the diagnosed steps it is much faster."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_synth import profile_steps

from tidal.planner import select as sel
from tidal.planner.config import PlannerConfig
from tidal.planner.dispatch import dispatch_alternatives, restart_dispatch, restart_dispatches

pytestmark = pytest.mark.unit
SETTINGS = dict(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])


KEEP1 = PlannerConfig(restart_keep=1)  # only the best restart packed


@settings(max_examples=150, **SETTINGS)
@given(case=profile_steps(60), keep=st.integers(1, 5), seed=st.integers(0, 3))
def test_restart_dispatches_are_the_best_restarts(case, keep, seed):
    prof, l_ = case
    found = restart_dispatches(l_, prof.pipes, 4, keep=keep, seed=seed)
    assert 1 <= len(found) <= keep  # below=inf: every restart qualifies
    objs = [r.objective for r in found]
    assert objs == sorted(objs)
    assert found[0] == restart_dispatch(l_, prof.pipes, 4, seed=seed)  # the best is what restart_dispatch returns
    for r in found:
        assert sorted(i for g in r.groups for i in g) == list(range(l_.size))
    cut = restart_dispatches(l_, prof.pipes, 4, keep=keep, seed=seed, below=objs[-1])
    assert all(r.objective < objs[-1] for r in cut)


@settings(max_examples=150, **SETTINGS)
@given(case=profile_steps(60))
def test_extra_leaves_the_alternatives_unchanged(case):
    prof, l_ = case
    extra: list = []
    first, alts = dispatch_alternatives(l_, prof.pipes, extra=extra)
    assert (first, alts) == dispatch_alternatives(l_, prof.pipes)
    assert len(extra) <= PlannerConfig().restart_keep - 1
    if extra:  # the next-best restarts, after the best (the restart alternative)
        assert alts and extra[0].objective >= alts[0].objective
        assert [r.objective for r in extra] == sorted(r.objective for r in extra)


@settings(max_examples=150, **SETTINGS)
@given(case=profile_steps(60), seed=st.integers(0, 2))
def test_assign_is_never_slower_with_them(case, seed):
    prof, l_ = case
    est1, _ = sel.assign(l_, prof, seed=seed, config=KEEP1)
    est, plans = sel.assign(l_, prof, seed=seed)
    assert est <= est1
    assert sorted(i for p in plans for mb in p.micro_batches for i in mb) == list(range(l_.size))
    assert est == max(p.est_time for p in plans)


@pytest.mark.parametrize("strategy,seed,step,before,after", [
    ("tp8cp2+tp4cp2+2*tp4", 1, 3, 1.07, 1.03),
    ("tp4cp4+4*tp4", 1, 4, 1.03, 1.012),
])
def test_diagnosed_steps_gain(strategy, seed, step, before, after):
    """llama-32b a800x32, synthetic:github (74-87 documents), two candidates of the strategy proposal: the restart
    with the lowest dispatch objective packs 1.074 and 1.031 x the candidate's bound, one of the next three packs
    1.028 and 1.011 x (measured when this was written; the thresholds leave room). Both are PP = 1 candidates:
    since decision 94 one stage costs the sum of its micro-batches, and the best restart alone packs 1.0047 and
    1.0044 x, so keeping more restarts only has to stay there (`before` is no longer reached)."""
    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel.analytic import analytic_v1  # the model the scenario was diagnosed under
    from tidal.data import sample_steps
    from tidal.planner.bounds import strategy_bound

    model, cluster = get_model("llama-32b"), get_cluster("a800x32")
    prof = sel.profile_strategies([place(parse_strategy(strategy), cluster, model)],
                                  analytic_v1(model, cluster))[0]
    l_ = sample_steps("synthetic:github", seed=seed, tokens_per_step=200_000, max_len=32768,
                      steps=step + 1)[0][step].lengths_array()
    bound = strategy_bound(l_, prof.pipes)
    est1, _ = sel.assign(l_, prof, target=bound, config=KEEP1)
    est, _ = sel.assign(l_, prof, target=bound)
    assert est <= est1 < after * bound
