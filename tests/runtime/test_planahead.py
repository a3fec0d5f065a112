"""Planning ahead in a background process (runtime.planahead): the same plans, documents, ledger counters and
resumable state as inline planning; a planner's failure surfaces in the trainer as one line instead of a hang."""

import dataclasses
import json
import multiprocessing as mp
import time
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from tidal.core.errors import TidalError
from tidal.core.scheme import parse_scheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.base import LatencyCoeffs
from tidal.costmodel.fitted import FittedCostModel, SchemeFit
from tidal.runtime.config import DataConfig, ModelConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.launch import run_distributed
from tidal.runtime.optim import OptimConfig
from tidal.runtime.planahead import (
    BackgroundPlannerError,
    BackgroundPlans,
    InlinePlans,
    ReplayPlanner,
    SetCostModel,
    open_plans,
)
from tidal.runtime.train import make_ledger, planner_spec, prepare

from _planahead_cases import Faulty, faulty_worker, jobs_worker, orphan_maker, rotate  # isort: skip

STRATS = "4*tp1;2*tp2;tp4;cp2+2*tp1"


def _job(source="stdlib:defs", packing="wlb", plan_ahead=2, steps=4, max_len=512, tps=4096, world=4, refit="off",
         strategies=None, gc_every=1):
    cfg = TrainConfig(model=ModelConfig("tiny", "sdpa"), world=WorldConfig(f"cpux{world}"),
                      data=DataConfig(source, max_len, tps, "split", 3),
                      planner=PlannerConfig(strategies or (STRATS if world == 4 else "2*tp1;tp2"), packing),
                      optimizer=OptimConfig(warmup_steps=1, decay_steps=10),
                      train=TrainSection(steps, 0, progress=False, plan_ahead=plan_ahead, refit=refit,
                                         refit_every=2, gc_every=gc_every))
    return prepare(cfg, world)


def _key(ps):
    """Everything of a planned step but the planner's wall-clock time."""
    if ps is None:
        return None
    d = ps.plan.to_dict()
    d.pop("plan_ms")
    return ps.index, d, ps.docs, ps.token_delay


def _stream(plans, job, n):
    """(step key, state after it, ledger counters after it) for n steps; the ledger records consumed steps."""
    ledger = make_ledger(job, planner_spec(job).corpus())
    out = []
    for _ in range(n):
        ps = plans.next()
        if ps is not None and ledger is not None:
            ledger.record_planned(ps)
        out.append((_key(ps), json.dumps(plans.state_dict(), sort_keys=True),
                    ledger.counters() if ledger is not None else None))
    return out


@pytest.mark.unit
@pytest.mark.parametrize("packing", ["wlb", "hydraulis"])
def test_background_plans_equal_inline(packing):
    job = _job(packing=packing)
    with open_plans(planner_spec(job), 0) as inline:
        want = _stream(inline, job, 12)
    with open_plans(planner_spec(job), 2) as bg:
        assert isinstance(bg, BackgroundPlans)
        got = _stream(bg, job, 12)
    assert got == want
    if packing == "wlb":  # the state carried delayed sequences, so the test covers the WLB queues
        assert any(json.loads(s)["in_flight"] for _, s, _ in want)
        assert want[-1][2]["seqs_delayed"] > 0


@pytest.mark.unit
def test_end_of_stream_and_flush_steps_equal_inline(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(x) for x in np.random.default_rng(0).integers(20, 500, size=60)))
    job = _job(source=f"random:lengths:{lengths}", max_len=512, tps=2048)
    with InlinePlans(planner_spec(job)) as inline:
        want = _stream(inline, job, 16)
    with BackgroundPlans(planner_spec(job), 3) as bg:
        got = _stream(bg, job, 16)
        t = time.perf_counter()
        assert bg.next() is None  # after the end: at once, not after a timeout
        assert time.perf_counter() - t < 5
    assert got == want
    ends = [k is None for k, _, _ in want]
    assert ends[-1] and not ends[0] and ends == sorted(ends)  # the epoch (and WLB flush steps) ended inside 16 steps
    assert want[-1][2]["docs_trained"] == 60 and want[-1][2]["pending_delayed"] == 0


@pytest.mark.unit
def test_state_is_as_of_the_last_consumed_step_and_resumes():
    job = _job()
    spec = planner_spec(job)
    with InlinePlans(spec) as inline:
        want = [_key(inline.next()) for _ in range(7)]
        inline_state3 = None
    with InlinePlans(spec) as inline:
        for _ in range(3):
            inline.next()
        inline_state3 = inline.state_dict()
    with BackgroundPlans(spec, 2) as bg:
        assert [_key(bg.next()) for _ in range(3)] == want[:3]
        time.sleep(1.0)  # let the process run ahead (it plans up to 3 more steps)
        state = bg.state_dict()
    assert state == inline_state3
    assert state["index"] == 3
    state = json.loads(json.dumps(state))  # a checkpoint round trip
    with BackgroundPlans(spec, 2, state=state) as bg:
        assert [_key(bg.next()) for _ in range(4)] == want[3:]
    with InlinePlans(spec, state=state) as inline:
        assert [_key(inline.next()) for _ in range(4)] == want[3:]


@pytest.mark.unit
def test_rewind_with_an_update_matches_inline():
    """What an online refit will send: rewind to the last consumed step and change the planner from there."""
    job = _job(packing="hydraulis")
    spec = planner_spec(job)

    def run(plans):
        first = [_key(plans.next()) for _ in range(2)]
        st = plans.state_dict()
        ahead = [_key(plans.next()) for _ in range(2)]  # planned, then thrown away by the rewind below
        plans.rewind(st, rotate)
        return first, ahead, [_key(plans.next()) for _ in range(4)], plans.state_dict()

    with InlinePlans(spec) as inline:
        want = run(inline)
    with BackgroundPlans(spec, 2) as bg:
        time.sleep(0.5)
        got = run(bg)
    assert got == want
    strategies = [k[1]["strategy"] for k in want[2]]
    assert strategies == [2 % 4, 3 % 4, 4 % 4, 5 % 4]  # rotate: step k on candidate k mod 4
    assert want[2][:2] != want[1]  # the update changed the plans of the rewound steps


@pytest.mark.unit
def test_a_cost_model_swap_reaches_the_background_planner():
    """Online refit's message: a fitted model (whose read-only mapping is made to pickle) applied after step 2."""
    job = _job(packing="wlb")
    spec = planner_spec(job)
    ana = AnalyticCostModel(job.spec, job.cluster)
    dev = job.cluster.device_type(0)
    fits = {}
    for s in ("tp1pp1cp1", "tp2pp1cp1", "tp4pp1cp1", "tp1pp1cp2"):
        c = ana.coeffs(parse_scheme(s), dev)
        slow = 50.0 if s == "tp2pp1cp1" else 1.0  # tp2 pipelines 50x slower: 2*tp2, chosen before, no longer
        fits[s] = SchemeFit(LatencyCoeffs(c.a * slow, c.b * slow, c.c * slow), 6, 0.0)
    refitted = FittedCostModel(job.spec, job.cluster, MappingProxyType(fits), ana)

    def run(plans):
        first = [_key(plans.next()) for _ in range(2)]
        plans.apply(SetCostModel(refitted))
        return first + [_key(plans.next()) for _ in range(5)], plans.state_dict()

    with InlinePlans(spec) as inline:
        want = run(inline)
    with InlinePlans(spec) as inline:
        plain = [_key(inline.next()) for _ in range(7)]
    with BackgroundPlans(spec, 2) as bg:
        time.sleep(0.5)  # the process has planned ahead with the old model
        got = run(bg)
    assert got == want
    assert want[0][:2] == plain[:2] and want[0][2:] != plain[2:]


@pytest.mark.unit
@pytest.mark.parametrize("at", [2, -1])
def test_planner_exception_surfaces_as_one_line(at):
    job = _job()
    bg = BackgroundPlans(Faulty(planner_spec(job), at), 2)
    try:
        for _ in range(max(at, 0)):
            assert bg.next() is not None
        with pytest.raises(BackgroundPlannerError) as e:
            bg.next()
    finally:
        bg.close()
    msg = str(e.value)
    assert "\n" not in msg
    want = "ValueError: boom at step 2" if at == 2 else "RuntimeError: cannot build the planner"
    assert msg.startswith(f"background planner raised {want} (at _planahead_cases.py:")
    assert "Traceback (most recent call last)" in e.value.traceback and want in e.value.traceback
    assert isinstance(e.value, TidalError)
    assert not bg.alive


@pytest.mark.unit
def test_dead_or_silent_planner_is_an_error_not_a_hang():
    job = _job()
    with BackgroundPlans(Faulty(planner_spec(job), 1, "exit"), 2) as bg:
        bg.next()
        with pytest.raises(BackgroundPlannerError, match="exited with code 3 without a plan"):
            bg.next()
    with BackgroundPlans(Faulty(planner_spec(job), 0, "hang"), 2, timeout_s=3.0) as bg:
        with pytest.raises(BackgroundPlannerError, match="no plan from the background planner within 3 s"):
            bg.next()
        assert not bg.alive  # terminated by close(), although it was still sleeping


@pytest.mark.unit
def test_close_stops_a_process_blocked_on_a_full_queue():
    bg = BackgroundPlans(planner_spec(_job()), 1)
    bg.next()
    time.sleep(1.0)  # the queue is full and the process waits to put the next plan
    assert bg.alive
    bg.close()
    bg.close()  # idempotent
    assert not bg.alive
    with pytest.raises(TidalError, match="closed"):
        bg.next()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for a reaper that a container may not have)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.unit
def test_planner_process_exits_when_the_trainer_dies():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    trainer = ctx.Process(target=orphan_maker, args=(planner_spec(_job()), q))
    trainer.start()
    pid = q.get(timeout=120)
    trainer.join(timeout=60)
    deadline = time.monotonic() + 30
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)


@pytest.mark.unit
def test_replay_and_bad_depth():
    job = _job(packing="hydraulis")
    with InlinePlans(planner_spec(job)) as inline:
        steps = [inline.next() for _ in range(3)]
    with BackgroundPlans(ReplayPlanner(steps), 2) as bg:
        assert [_key(bg.next()) for _ in range(4)] == [*map(_key, steps), None]
        assert bg.state_dict() == {"replayed": 3}
    with pytest.raises(TidalError, match="positive integer"):
        BackgroundPlans(ReplayPlanner(steps), 0)
    with pytest.raises(TidalError, match="must be picklable"):
        BackgroundPlans(lambda: ReplayPlanner(steps), 2)
    cfg = dataclasses.replace(job.config, train=dataclasses.replace(job.config.train, plan_ahead=-1))
    with pytest.raises(TidalError, match="plan_ahead must be >= 0"):
        prepare(cfg, 4)


@pytest.mark.distributed
def test_training_with_plan_ahead_equals_inline():
    """Also with the online refit, which swaps the planner's cost model through the plan stream. A refit is fed by
    measured times, so two runs refit to different models: their plans agree up to the first refit (the swap itself
    is checked to match inline in test_a_cost_model_swap_reaches_the_background_planner). The first pair also
    differs in garbage collection (decision 66): Python's automatic GC inline, a collection every 2 steps ahead;
    neither changes what is trained."""
    jobs = [_job(packing="wlb", plan_ahead=p, steps=s, max_len=256, tps=1024, world=2, refit=r, strategies=st,
                 gc_every=g) for r, s, st in (("off", 4, None), ("online", 6, "2*tp1")) for p, g in ((0, 0), (2, 2))]
    results = run_distributed(jobs_worker, 2, jobs, timeout_s=600)[0]
    keep = ("step", "strategy", "documents", "deferred", "tokens", "loss", "docs_run", "data", "token_delay",
            "cost_model", "predicted_s")
    inline, ahead = results[:2]
    assert [{k: r[k] for k in keep} for r in ahead.rows] == [{k: r[k] for k in keep} for r in inline.rows]
    assert ahead.planner_state == inline.planner_state and ahead.planner_state["index"] == 4
    assert [r["gc_s"] == 0.0 for r in inline.rows] == [True] * 4  # automatic GC: no collection at the boundary
    assert [r["gc_s"] > 0.0 for r in ahead.rows] == [False, True, False, True]  # after steps 2 and 4
    inline, ahead = results[2:]
    assert [{k: r[k] for k in keep} for r in ahead.rows[:4]] == [{k: r[k] for k in keep} for r in inline.rows[:4]]
    labels = [r["cost_model"] for r in ahead.rows]  # refit after 3 steps of 2 tp1 pipelines (6 rows), at step 4
    assert labels == ["analytic"] * 4 + ["refit-1"] * 2 == [r["cost_model"] for r in inline.rows]
    assert ahead.planner_state["index"] == 6
    for r in ahead.rows + inline.rows:
        assert 0 <= r["plan_wait_s"] <= r["loop_s"] and r["plan_s"] >= 0 and r["plan_cpu_s"] >= 0


@pytest.mark.distributed
def test_training_surfaces_a_planner_exception():
    job = _job(packing="hydraulis", steps=4, max_len=256, tps=1024, world=2)
    with pytest.raises(RuntimeError, match="background planner raised ValueError: boom at step 2"):
        run_distributed(faulty_worker, 2, job, Faulty(planner_spec(job), 2), timeout_s=300)
