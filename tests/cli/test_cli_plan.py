"""`tidal plan` end to end: JSON invariants, determinism, and one-line errors with exit code 2."""

import subprocess
import sys

import numpy as np
import pytest

from tidal.cli.main import main
from tidal.core import Plan

pytestmark = pytest.mark.unit

BASE = ["plan", "--model", "llama2-7b", "--cluster", "a800x16", "--tokens-per-step", "60000", "--max-len", "16384",
        "--steps", "3", "--quiet"]


def _run(tmp_path, *extra, name="p.json"):
    out = tmp_path / name
    assert main([*BASE, *extra, "--json", str(out)]) == 0
    return Plan.load(out), out


def _check_invariants(plan: Plan):
    for st in plan.steps:
        placed = [i for p in st.pipelines for mb in p.micro_batches for i in mb] + list(st.deferred)
        assert sorted(placed) == list(range(len(st.seq_lengths)))
        for p in st.pipelines:
            for mb in p.micro_batches:
                assert sum(st.seq_lengths[i] for i in mb) <= p.max_len
            assert len(p.cp_sharding) == (len(p.micro_batches) if p.cp > 1 else 0)
        assert st.est_step_time >= st.lower_bound - 1e-12
        assert max(st.seq_lengths, default=0) <= 16384


@pytest.mark.parametrize("packing", ["hydraulis", "wlb", "fixed"])
def test_plan_json_invariants(tmp_path, packing):
    plan, _ = _run(tmp_path, "--packing", packing, "--strategies", "tp2cp2+2*tp1+tp1pp2;4*tp2;tp4+tp2+2*tp1")
    assert plan.candidates == ("tp2cp2+2*tp1+pp2", "4*tp2", "tp4+tp2+2*tp1")
    _check_invariants(plan)
    ids = [plan.steps[k].seq_ids[i] for k in range(len(plan.steps)) for p in plan.steps[k].pipelines
           for mb in p.micro_batches for i in mb]
    assert len(ids) == len(set(ids))  # a deferred sequence runs once, in a later step


@pytest.mark.parametrize("packing", ["hydraulis", "wlb"])
def test_prove_bound_raises_only_the_bound(tmp_path, packing):
    # the LP-priced bound (proof.lp) after planning: the same plans, bounds never lower and never above the estimate
    strategies = "tp4+4*tp2+4*tp1;4*tp4;tp8+4*tp2"
    a, _ = _run(tmp_path, "--packing", packing, "--strategies", strategies, "--data", "synthetic:github", name="a.json")
    b, _ = _run(tmp_path, "--packing", packing, "--strategies", strategies, "--data", "synthetic:github",
                "--prove-bound", name="b.json")
    assert b.meta["prove_bound"] is True and a.meta["prove_bound"] is False
    _check_invariants(b)
    for sa, sb in zip(a.steps, b.steps, strict=True):
        assert [p.to_dict() for p in sa.pipelines] == [p.to_dict() for p in sb.pipelines]
        assert sa.lower_bound <= sb.lower_bound <= sb.est_step_time * (1 + 1e-9)


def test_wlb_never_drops_a_sequence(tmp_path):
    plan, _ = _run(tmp_path, "--packing", "wlb", "--strategies", "4*tp2")
    ran = sorted(plan.steps[k].seq_ids[i] for k in range(len(plan.steps)) for p in plan.steps[k].pipelines
                 for mb in p.micro_batches for i in mb)
    offered = sorted({sid for st in plan.steps for sid in st.seq_ids})
    assert ran == offered


def test_auto_strategies_and_byte_identical_plans(tmp_path):
    a, _ = _run(tmp_path, name="a.json")
    b, _ = _run(tmp_path, name="b.json")
    assert a.to_json(timings=False) == b.to_json(timings=False)
    _check_invariants(a)
    assert len(a.candidates) >= 1


def test_lengths_file_and_long_docs(tmp_path):
    f = tmp_path / "lens.txt"
    f.write_text("\n".join(str(x) for x in [100, 40000, 7, 3000, 20000, 1] * 5))
    plan, _ = _run(tmp_path, "--data", f"lengths:{f}", "--strategies", "4*tp4")
    assert max(max(s.seq_lengths) for s in plan.steps) <= 16384
    np.save(tmp_path / "lens.npy", np.array([5, 6, 7] * 100, dtype=np.int64))
    plan, _ = _run(tmp_path, "--data", f"lengths:{tmp_path / 'lens.npy'}", "--strategies", "4*tp4", name="n.json")
    assert sorted(x for s in plan.steps for x in s.seq_lengths) == sorted([5, 6, 7] * 100)  # finite file: all of it


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--strategies", "tp3"], "TP=3 does not divide heads"),
        (["--strategies", "4*tp8"], "needs 32 devices"),
        (["--strategies", "tp1", "--max-len", "100000"], "exceeds the MaxLen of every scheme"),
        (["--model", "gpt9"], "unknown model preset"),
        (["--cluster", "z100x8"], "unknown cluster preset"),
        (["--data", "lengths:/nonexistent/file.txt"], "does not exist"),
        (["--data", "synthetic:nope"], "unknown synthetic source"),
        (["--long-docs", "error", "--data", "synthetic:github", "--strategies", "4*tp4", "--max-len", "2048"],
         "tokens > max_len 2048"),
    ],
)
def test_errors_are_one_line_exit_2(tmp_path, capsys, args, msg):
    rc = main([*BASE, *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and msg in err, err


@pytest.mark.parametrize("cmd", ["plan", "simulate", "demo", "profile", "verify"])
@pytest.mark.parametrize("value", ["-1", "x"])
def test_bad_seed_is_a_usage_error(capsys, cmd, value):
    """A negative or non-integer --seed is argparse's usage error (exit 2, the reason on the last line), never a
    numpy traceback from deep in the sampler."""
    with pytest.raises(SystemExit) as e:
        main([cmd, "--seed", value])
    assert e.value.code == 2
    assert "--seed: expected a non-negative integer seed" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("cmd", ["train", "profile"])
@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_bad_timeout_is_a_usage_error(capsys, cmd, value):
    """--timeout 0 used to reach the rank launcher and fail there with a traceback once no rank could report."""
    with pytest.raises(SystemExit) as e:
        main([cmd, "--timeout", value])
    assert e.value.code == 2
    assert "--timeout: expected seconds > 0" in capsys.readouterr().err.strip().splitlines()[-1]


def test_malformed_lengths_file(tmp_path, capsys):
    f = tmp_path / "bad.txt"
    f.write_text("12\nfoo\n3\n")
    assert main([*BASE, "--data", f"lengths:{f}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.txt:2: not an integer" in err


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "tidal", "plan", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--packing" in r.stdout


FIT = (2e-7, 4e-5, 1e-2)  # a, b, c of the profile below: one tp1 micro-batch of l tokens costs c + a l^2 + b l


def _plan_one_doc(tmp_path, *extra):
    """`tidal plan` of one 300-token document on tiny, cpux4, 4*tp1, with a fitted profile CSV (format of
    docs/costmodel.md, as benchmarks/runtime_pipeline.py --out writes) as the cost model."""
    a, b, c = FIT
    rows = [[128], [32] * 4, [512], [256, 256], [1000, 24], [700]]
    text = "# tidal-profile/1 model=tiny device=cpu\nscheme,lengths,seconds\n" + "".join(
        f"tp1,{' '.join(map(str, r))},{c + sum(a * x * x + b * x for x in r):.9f}\n" for r in rows)
    prof = tmp_path / "profile.csv"
    prof.write_text(text)
    lens = tmp_path / "l.txt"
    lens.write_text("300\n")
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "tiny", "--cluster", "cpux4", "--cost-model", str(prof), "--strategies", "4*tp1",
                 "--data", f"lengths:{lens}", "--max-len", "1024", "--tokens-per-step", "1000", "--steps", "1",
                 "--quiet", "--json", str(out), *extra]) == 0
    return Plan.load(out)


def test_fitted_cost_model_from_profile_on_cpu_cluster(tmp_path):
    """The profile drives the plan: without the charges (`--no-charges`, decision 98's ablation) the estimate is the
    fitted coefficients' c + a l^2 + b l."""
    a, b, c = FIT
    plan = _plan_one_doc(tmp_path, "--no-charges")
    step = plan.steps[0]
    assert plan.meta["charges"] is False
    assert step.est_step_time == pytest.approx(c + a * 300**2 + b * 300, rel=1e-6)
    assert step.lower_bound <= step.est_step_time


def test_plan_charges_the_pull_and_push_as_costmodel_sync_prices_them(tmp_path):
    """Decision 98: `tidal plan` charges the gradient pull/push by default, as the simulator executes it. One
    4096-token document of llama2-7b on one of 16 TP1 pipelines of a800x16: the charged estimate is the uncharged
    one (`--no-charges`: that micro-batch's forward + backward) plus `costmodel.sync.sync_delay` of the pipeline's
    pull/push (`pipeline_sync` under the simulator's pricing `SimConfig().sync`, the optimizer state sharded over the
    16 devices), the forward share of the micro-batch hiding the pull and the backward share the push."""
    from tidal.core.cluster import get_cluster
    from tidal.core.model import get_model
    from tidal.costmodel.sync import SyncPricing, pipeline_sync, sync_delay
    from tidal.simulator.engine import SimConfig

    lens = tmp_path / "l.txt"
    lens.write_text("4096\n")
    args = ["plan", "--model", "llama2-7b", "--cluster", "a800x16", "--strategies", "16*tp1", "--data",
            f"lengths:{lens}", "--max-len", "4096", "--tokens-per-step", "4096", "--steps", "1", "--quiet", "--json"]
    assert main([*args, str(tmp_path / "on.json")]) == 0
    assert main([*args, str(tmp_path / "off.json"), "--no-charges"]) == 0
    on, off = Plan.load(tmp_path / "on.json"), Plan.load(tmp_path / "off.json")
    assert on.meta["charges"] is True and off.meta["charges"] is False
    (pipe,) = [p for p in on.steps[0].pipelines if p.micro_batches]
    t = off.steps[0].est_step_time
    pricing = SyncPricing()
    assert SimConfig().sync == pricing  # the planner's pricing is the simulator's
    model, cluster = get_model("llama2-7b"), get_cluster("a800x16")
    pull, push = pipeline_sync(model, cluster, pipe.devices, 1, 1, (model.layers,), 16, pricing)
    delay = sync_delay(pull, push, np.array([float(model.layers)]), pricing.fwd_share * t,
                       (1 - pricing.fwd_share) * t, pricing.overlap)
    assert delay > 0.05 * t  # a term worth charging: 7B parameters pulled and pushed at a device's share of links
    assert on.steps[0].est_step_time == pytest.approx(t + delay, rel=1e-9)
    assert pipe.est_time == pytest.approx(t + delay, rel=1e-9)
    assert on.steps[0].lower_bound <= on.steps[0].est_step_time
