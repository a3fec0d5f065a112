"""Property tests of the per-step planner on cheap synthetic strategies (>= 10,000 generated steps with the packer
contract's examples)."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_synth import MAX_LEN, PROFILES

from tidal.baselines.fixed import pack_fixed
from tidal.core import StepPlan, TidalError
from tidal.planner.bounds import PipeCost, pipeline_bound, strategy_bound
from tidal.planner.dispatch import dispatch, evaluate
from tidal.planner.packing import pack
from tidal.planner.select import select_step

pytestmark = pytest.mark.unit

SETTINGS = dict(derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

lengths_st = st.one_of(
    st.lists(st.integers(1, 600), max_size=40),
    st.lists(st.integers(1, 40), max_size=60),
    st.lists(st.just(1), max_size=30),  # all length 1
    st.builds(lambda xs, g: xs + [g], st.lists(st.integers(1, 30), max_size=20), st.integers(300, 500)),  # one giant
    st.lists(st.integers(1, 400), max_size=3),  # fewer sequences than pipelines
)
cands_st = st.lists(st.integers(0, len(PROFILES) - 1), min_size=1, max_size=4, unique=True)


def check_step(lengths, profiles, plan: StepPlan):
    l_ = np.asarray(lengths, dtype=np.int64)
    seen = sorted(i for p in plan.pipelines for mb in p.micro_batches for i in mb)
    assert seen == list(range(l_.size)), "each sequence exactly once"
    prof = profiles[plan.strategy]
    assert len(plan.pipelines) == len(prof.pipes)
    for pp_, pc in zip(plan.pipelines, prof.pipes):
        assert pp_.max_len == pc.max_len and pp_.pp == pc.pp
        for mb in pp_.micro_batches:
            assert len(mb) and int(l_[list(mb)].sum()) <= pp_.max_len, "micro-batch within MaxLen"
        idx = [i for mb in pp_.micro_batches for i in mb]
        assert pp_.est_time >= pipeline_bound(l_[idx], pc)
    assert plan.est_step_time == pytest.approx(max((p.est_time for p in plan.pipelines), default=0.0), rel=1e-12)
    assert plan.est_step_time >= plan.lower_bound, "estimate >= lower bound"
    assert plan.est_step_time >= strategy_bound(l_, prof.pipes)
    assert plan.seq_lengths == tuple(int(x) for x in l_)


@settings(max_examples=2000, **SETTINGS)
@given(lengths=lengths_st, cands=cands_st, seed=st.integers(0, 3))
def test_select_invariants(lengths, cands, seed):
    profiles = [PROFILES[k] for k in cands]
    if lengths and max(lengths) > max(p.max_len for p in profiles):
        with pytest.raises(TidalError, match="exceeds the MaxLen of every candidate"):
            select_step(lengths, profiles, seed=seed)
        return
    sel = select_step(lengths, profiles, seed=seed)
    check_step(lengths, profiles, sel.plan)
    again = select_step(list(lengths), profiles, seed=seed).plan
    assert json.dumps(again.to_dict(timings=False)) == json.dumps(sel.plan.to_dict(timings=False))
    if seed == 0:  # with tol = 0 pruning never changes the answer; the default tol costs at most a factor 1 + tol
        exact_ = select_step(lengths, profiles, seed=seed, tol=0.0).plan
        full = select_step(lengths, profiles, seed=seed, prune=False, tol=0.0).plan
        assert full.strategy == exact_.strategy and full.est_step_time == exact_.est_step_time
        assert exact_.est_step_time <= sel.plan.est_step_time <= exact_.est_step_time * (1 + 1e-3)


@settings(max_examples=1500, **SETTINGS)
@given(lengths=lengths_st, cands=cands_st)
def test_select_with_fixed_packer(lengths, cands):
    profiles = [PROFILES[k] for k in cands]
    if lengths and max(lengths) > max(p.max_len for p in profiles):
        return
    check_step(lengths, profiles, select_step(lengths, profiles, packer=pack_fixed).plan)


pipe_st = st.builds(PipeCost, st.sampled_from([0.0, 1e-5, 1e-3]), st.sampled_from([0.0, 1e-2, 1.0]),
                    st.sampled_from([0.0, 0.01, 0.5]), st.integers(1, 5), st.integers(1, 300),
                    st.sampled_from([0.0, 0.0, 0.02, 0.5]))  # d: the per-document term, often absent


@settings(max_examples=2500, **SETTINGS)
@given(lengths=st.lists(st.integers(1, 300), max_size=30), pipes=st.lists(pipe_st, min_size=1, max_size=6))
def test_dispatch_invariants(lengths, pipes):
    if lengths and max(lengths) > max(p.max_len for p in pipes):
        with pytest.raises(TidalError):
            dispatch(lengths, pipes)
        return
    res = dispatch(lengths, pipes)
    assert sorted(i for g in res.groups for i in g) == list(range(len(lengths)))
    for g, p in zip(res.groups, pipes):
        assert all(lengths[i] <= p.max_len for i in g), "eligibility"
    assert res.objective == pytest.approx(evaluate(lengths, pipes, res.groups).objective)
    packed = [pack([lengths[i] for i in g], p.coeffs, p.pp, p.max_len).est_time for g, p in zip(res.groups, pipes)]
    assert max(packed) >= strategy_bound(lengths, pipes), "a dispatch + packing never beats the step bound"
    assert max(packed) >= res.objective * (1 - 1e-9), "D_j is a lower bound on the packed pipeline time"
    assert dispatch(lengths, pipes) == res


def test_empty_step():
    sel = select_step([], PROFILES[:2])
    assert sel.plan.est_step_time == 0.0 and sel.plan.lower_bound == 0.0
    assert all(p.micro_batches == () for p in sel.plan.pipelines)
    StepPlan.from_dict(sel.plan.to_dict())


def test_infeasible_message_is_one_line():
    with pytest.raises(TidalError) as e:
        select_step([10, 10_000], PROFILES)
    assert "\n" not in str(e.value)


def test_fewer_sequences_than_pipelines_leaves_pipelines_empty():
    plan = select_step([5], [PROFILES[4]]).plan  # 4 pipelines, one sequence
    assert sum(1 for p in plan.pipelines if p.micro_batches) == 1


def test_seq_ids_and_bad_input():
    plan = select_step([3, 4], PROFILES[:1], seq_ids=[100, 101]).plan
    assert plan.seq_ids == (100, 101)
    with pytest.raises(TidalError):
        select_step([3, 4], PROFILES[:1], seq_ids=[1])
    with pytest.raises(TidalError):
        select_step([3, 0], PROFILES[:1])
    with pytest.raises(TidalError):
        select_step([3], [])


def test_max_len_of_profiles():
    assert MAX_LEN == 500


@pytest.mark.parametrize("lengths", [[1], [1, 2, 3], [1] * 17, [2, 3, 1, 1, 2, 700]])
def test_cp_larger_than_sequences_with_a_real_cost_model(lengths):
    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel import default_cost_model
    from tidal.planner.select import profile_strategies

    model, cluster = get_model("tiny"), get_cluster("a800x8")
    cm = default_cost_model(model, cluster)
    cands = [place(parse_strategy(s), cluster, model) for s in ("cp4+4*tp1", "2*cp4", "tp2cp2+pp2cp2")]
    profiles = profile_strategies(cands, cm)
    sel = select_step(lengths, profiles, seed=1)
    check_step(lengths, profiles, sel.plan)
    assert {p.cp for p in sel.plan.pipelines} & {2, 4}


def test_scheme_without_memory_is_rejected():
    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.costmodel import default_cost_model
    from tidal.planner.select import profile_strategies

    # llama3-70b's 16-bit weights alone (141 GB) exceed one 80 GB device at TP=1: MaxLen 0
    model, cluster = get_model("llama3-70b"), get_cluster("a800x8")
    with pytest.raises(TidalError, match="does not fit"):
        profile_strategies([place(parse_strategy("8*tp1"), cluster, model)], default_cost_model(model, cluster))
