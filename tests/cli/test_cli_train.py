"""`tidal train` / `tidal verify` / `tidal demo` at the CLI: configs that cannot run are refused with one line and exit
2 before any process starts; a real 2-step run writes the documented JSONL rows."""

import json

import pytest

from tidal.cli.main import main

from _tiny_config import tiny_toml  # isort: skip

GOOD = tiny_toml(optimizer=True, train="steps = 2\nprogress = false\n")


def _write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def no_spawn(monkeypatch):
    """Fail loudly if any rank would be started: refusals must come before process groups exist."""
    import tidal.runtime.launch as launch

    def boom(*a, **k):
        raise AssertionError("a process was started for a config that cannot run")

    monkeypatch.setattr(launch, "run_distributed", boom)


REFUSALS = [
    # (what, toml edit, extra argv, expected message fragment)
    ("world size vs cluster", lambda t: t, ["--nproc", "2"], "world size 2 does not match cluster cpux4"),
    ("strategy needs more devices", lambda t: t.replace('"tp2+2*tp1;4*tp1"', '"8*tp1"'), [], "needs 8 devices"),
    ("scheme does not fit memory", lambda t: t.replace('name = "tiny"', 'name = "llama2-7b"').replace(
        'strategies = "tp2+2*tp1;4*tp1"', 'strategies = "4*tp1"'), [], "does not fit"),
    ("TP does not divide heads", lambda t: t.replace('"tp2+2*tp1;4*tp1"', '"tp4;tp3+tp1"'), [], "does not divide"),
    ("max-len above every scheme", lambda t: t.replace("max_len = 128", "max_len = 10000000"), [], "exceeds"),
    ("unknown key", lambda t: t.replace("steps = 2", "stepz = 2"), [], "unknown key 'stepz'"),
    ("unknown section", lambda t: t + "\n[trainer]\nx = 1\n", [], "unknown section [trainer]"),
    ("wrong type", lambda t: t.replace("steps = 2", 'steps = "two"'), [], "expected int"),
    ("malformed TOML", lambda t: t.replace("[world]", "[world"), [], "malformed TOML"),
    ("bad corpus", lambda t: t.replace('"stdlib:defs"', '"webtext"'), [], "bad corpus spec"),
    ("bad dtype", lambda t: t.replace("progress = false", 'progress = false\nmaster_dtype = "bfloat16"'), [],
     "master_dtype"),
    ("bad compute dtype", lambda t: t.replace("progress = false", 'progress = false\ncompute_dtype = "fp16"'), [],
     "[train] compute_dtype must be one of auto"),
    ("no steps", lambda t: t.replace("steps = 2", "steps = 0"), [], "steps must be >= 1"),
    ("negative seed", lambda t: t.replace("steps = 2", "steps = 2\nseed = -1"), [], "[train] seed must be >= 0"),
    ("negative plan_ahead", lambda t: t.replace("steps = 2", "steps = 2\nplan_ahead = -1"), [],
     "plan_ahead must be >= 0"),
    ("negative gc_every", lambda t: t.replace("steps = 2", "steps = 2\ngc_every = -1"), [],
     "gc_every must be an integer >= 0"),
]


@pytest.mark.unit
@pytest.mark.parametrize("what,edit,argv,msg", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_bad_config_is_refused_before_any_process(tmp_path, capsys, no_spawn, what, edit, argv, msg):
    cfg = _write(tmp_path, edit(GOOD))
    args = ["train", "--config", str(cfg)] + (argv or ["--nproc", "4"])
    assert main(args) == 2, what
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


@pytest.mark.unit
def test_missing_config_file(tmp_path, capsys, no_spawn):
    assert main(["train", "--config", str(tmp_path / "nope.toml"), "--nproc", "4"]) == 2
    assert "cannot read config" in capsys.readouterr().err


@pytest.mark.distributed
def test_train_writes_metrics_rows(tmp_path):
    cfg = _write(tmp_path, GOOD)
    out = tmp_path / "m.jsonl"
    assert main(["train", "--config", str(cfg), "--nproc", "4", "--metrics", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for k in ("strategy", "documents", "tokens", "loss", "wall_s", "busy_s", "critical_path_s", "imbalance",
                  "est_step_time_s", "pull_s", "push_s", "pull_bytes", "push_bytes"):
            assert k in r, k
        assert len(r["busy_s"]) == 4 and r["critical_path_s"] == max(r["busy_s"])
        assert r["tokens"] > 0 and r["loss"] > 0
        # calibration: per pipeline predicted (sum of its micro-batches' T) beside measured (slowest rank)
        assert r["cost_model"] == "analytic" and r["pipelines"]
        assert r["measured_s"] == pytest.approx(max(r["compute_busy_s"]))
        assert r["predicted_s"] == max(q["predicted_s"] for q in r["pipelines"]) > 0
        for q in r["pipelines"]:
            assert q["measured_s"] == max(r["compute_busy_s"][k] for k in q["ranks"]) > 0
    assert sum(q["sum_len"] for r in rows for q in r["pipelines"]) == sum(r["tokens"] for r in rows)


@pytest.mark.distributed
def test_verify_cli_passes_and_report_catches_a_defect(capsys):
    """`tidal verify` exits 0 on a correct run; the same comparison flags a perturbed parameter shard."""
    import numpy as np

    from tidal.cli.train import VERIFY_TOL, verify_report

    assert main(["verify", "--nproc", "4", "--strategies", "tp2+2*tp1;cp2+tp1pp2", "--steps", "2",
                 "--max-len", "96", "--tokens-per-step", "384"]) == 0
    assert "PASS" in capsys.readouterr().out
    ref = {"params": {"w": np.ones((4, 4))}, "m": {"w": np.ones(3)}, "v": {"w": np.ones(3)}}
    bad = {"params": {"w": np.ones((4, 4)) + 1e-6}, "m": {"w": np.ones(3)}, "v": {"w": np.ones(3)}}
    rep = verify_report([{"loss": 1.0}], [1.0], bad, ref)
    assert rep["params"] > VERIFY_TOL["float64"]["params"] and rep["loss"] == 0.0


@pytest.mark.distributed
def test_demo_small(tmp_path, capsys):
    """The README's main command, shortened: two runs on 2 ranks on the same documents under a memory budget,
    losses agree, PNG written; then the simulated section, here on the analytic A800 model (no pools in tmp_path)."""
    out = tmp_path / "demo"
    assert main(["demo", "--steps", "2", "--max-len", "512", "--tokens-per-step", "1024", "--memory-gib", "0.02",
                 "--out", str(out), "--sim-steps", "1", "--pools", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "wall: static / Tidal" in text and "noise floor" in text and "(agree)" in text
    assert "same documents: True" in text and "2 rounds" in text and "2 ranks" in text
    assert "memory budget 0.02 GiB per rank" in text and "steps whose documents all fit tp1:" in text
    assert "What this means:" in text
    assert "SIMULATED, not measured" in text and "no Hydraulis pool at" in text and "analytic A800 model" in text
    assert (out / "demo.png").stat().st_size > 10_000
    rows = [json.loads(x) for x in (out / "tidal.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 1, 2, 2]
