"""`tidal simulate` end to end: JSON schema, report files, and index.html rendered by headless Chromium."""

import io
import json
import re
import shutil
import subprocess

import pytest

from tidal.cli.main import main
from tidal.cli.sim_report import CHARTS

pytestmark = pytest.mark.unit

BASE = ["simulate", "--model", "llama2-7b", "--cluster", "a800x16", "--tokens-per-step", "40000", "--max-len",
        "16384", "--steps", "3", "--quiet", "--systems", "megatron,deepspeed,tidal"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    assert main([*BASE, "--json", str(d / "r.json"), "--report", str(d / "rep")]) == 0
    return d


def test_json_schema(out):
    r = json.loads((out / "r.json").read_text())
    assert set(r["systems"]) == {"megatron", "deepspeed", "tidal"}
    for v in r["systems"].values():
        assert {"config", "step_times", "mean_step_time", "tokens_per_s"} <= set(v)
        assert len(v["step_times"]) == 3 and v["mean_step_time"] == pytest.approx(sum(v["step_times"]) / 3)
    sp = r["speedup_vs_best_static"]
    assert max(sp["megatron"], sp["deepspeed"]) == pytest.approx(1.0)
    tps = {k: v["tokens_per_s"] for k, v in r["systems"].items()}
    assert sp["tidal"] == pytest.approx(tps["tidal"] / max(tps["megatron"], tps["deepspeed"]))


def test_report_files(out):
    rep = out / "rep"
    for c in CHARTS:
        data = (rep / f"{c}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    page = (rep / "index.html").read_text()
    assert all(f'id="chart-{c}"' in page for c in CHARTS)
    assert "src=\"http" not in page and "<link" not in page  # self-contained


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_report_renders_in_headless_chromium(out):
    page = out / "rep" / "index.html"
    res = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r'data-charts-loaded="(\d+)"', res.stdout)
    assert m, res.stdout[:500]
    assert int(m.group(1)) == len(CHARTS)  # every chart decoded
    for c in CHARTS:
        assert f'id="chart-{c}"' in res.stdout


def test_bad_system_is_one_line_error(capsys):
    assert main([*BASE[:-1], "megatron,nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nosuch" in err[0]


def test_a_system_that_cannot_run_is_reported_not_fatal(tmp_path, capsys):
    # no homogeneous Megatron config holds llama-32b on 8 A800s; FlexPipe (TP = 1, 8 stages, recomputation) still runs
    out = tmp_path / "r.json"
    argv = ["simulate", "--model", "llama-32b", "--cluster", "a800x8", "--tokens-per-step", "40000", "--max-len",
            "8192", "--steps", "1", "--quiet", "--systems", "megatron,flexpipe", "--json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert set(r["systems"]) == {"flexpipe"} and "megatron" in r["errors"]
    assert "megatron cannot run" in capsys.readouterr().out
    assert r["speedup_vs_best_static"] == {}


def test_truth_flag_executes_on_the_profile(tmp_path):
    """`--truth POOL.json`: the same plans (estimates) as without it, executed on the pool's times; recorded in meta."""
    from pathlib import Path

    pool = Path("/work/shared/data/hydraulis-profiles/strategy_pool_7b.json")
    if not pool.exists():
        pytest.skip("Hydraulis profiles not present")
    args = ["simulate", "--model", "llama2-7b", "--cluster", "a800x8", "--tokens-per-step", "30000", "--max-len",
            "8192", "--steps", "1", "--quiet", "--systems", "tidal"]
    assert main([*args, "--json", str(tmp_path / "a.json")]) == 0
    assert main([*args, "--truth", str(pool), "--json", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["meta"]["truth"] == "as planned" and b["meta"]["truth"] == str(pool)
    ta, tb = a["systems"]["tidal"], b["systems"]["tidal"]
    assert ta["est_step_times"] == tb["est_step_times"] and ta["strategies"] == tb["strategies"]
    assert ta["step_times"] != tb["step_times"]
    assert main([*args, "--truth", str(tmp_path / "missing.json")]) == 2  # a bad truth: one line, exit 2
def _fake_runs():
    from tidal.simulator.runs import SystemRun

    runs = []
    for i, name in enumerate(("megatron", "deepspeed-paper", "megatron-paper", "hydraulis", "tidal")):
        r = SystemRun(name, "candidate-only-a ; candidate-only-b")
        r.strategies = ["2*tp2cp2"] * (5 + i) + ["tp2+6*tp1"] * 3 + ["tp4+4*tp1"]
        runs.append(r)
    return runs


@pytest.mark.parametrize("width", [60, 80, 200])
def test_table_shows_chosen_strategies_and_never_cuts_a_name(width):
    from rich.console import Console

    from tidal.cli.simulate import sim_tables

    runs = _fake_runs()
    con = Console(width=width, record=True, file=io.StringIO())
    for t in sim_tables(runs, {r.name: 1.0 for r in runs}, "simulate: test", width):
        con.print(t)
    text = con.export_text()
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= width
    for r in runs:
        assert any(x.lstrip().startswith(r.name + " ") for x in lines), r.name  # whole, not "deepspeed-p…"
    flat = "".join(x.strip() for x in lines)
    assert "2*tp2cp2x9" in flat.replace(" ", "")  # tidal's most used strategy and its step count (folded or not)
    assert "candidate-only" not in text  # the candidates are not the table's
    if width >= 200:  # wide: the strategies sit beside the figures
        assert len([x for x in lines if x.lstrip().startswith("tidal ")]) == 1


def test_report_table_shows_strategies_run(out):
    page = (out / "rep" / "index.html").read_text()
    assert "strategies run (steps)" in page
    r = json.loads((out / "r.json").read_text())
    for s in r["systems"]["tidal"]["strategies"]:
        assert s in page
