"""One config system (decision 87): `--section.key VALUE` overrides for every TOML key in `tidal train` and `tidal
verify` (the older flags are aliases), `tidal plan/simulate --config` dry runs of the training job, `--help` with
defaults and examples, unknown flags named with the closest known one, and the two run-time warnings."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

import pytest

from tidal.cli.main import build_parser, main
from tidal.core.errors import TidalError

from _tiny_config import tiny_toml  # isort: skip

pytestmark = pytest.mark.unit

GOOD = tiny_toml(256, 1024, train="steps = 7\nprogress = false\n")


def _cfg(tmp_path, text=GOOD):
    p = tmp_path / "train.toml"
    p.write_text(text)
    return p


def test_every_key_has_a_flag_and_overrides_reach_the_config(tmp_path):
    from tidal.cli.configargs import KEY_HELP
    from tidal.runtime.config import load_config, section_classes

    keys = {f"{s}.{f.name}" for s, cls in section_classes().items() for f in fields(cls)}
    assert keys == set(KEY_HELP), keys ^ set(KEY_HELP)
    sub = build_parser()._subparsers._group_actions[0].choices
    for command in ("train", "verify", "plan", "simulate"):
        flags = set(sub[command]._option_string_actions)
        assert {f"--{k}" for k in keys} <= flags, command
    args = build_parser().parse_args(["train", "--config", "x.toml", "--train.steps", "5", "--data.max_len", "512",
                                      "--planner.strategies", "4*tp1", "--model.layers", "4", "--train.resume",
                                      "--optimizer.lr", "2e-3", "--data.cycle", "false"])
    cfg = load_config(_cfg(tmp_path), args.overrides)
    assert (cfg.train.steps, cfg.data.max_len, cfg.planner.strategies, cfg.model.layers) == (5, 512, "4*tp1", 4)
    assert cfg.train.resume is True and cfg.optimizer.lr == 2e-3 and cfg.data.cycle is False
    assert cfg.data.tokens_per_step == 1024  # untouched keys keep the file's values


def test_aliases_are_overrides_in_command_line_order(tmp_path):
    from tidal.runtime.config import load_config

    a = build_parser().parse_args(["train", "--config", "x", "--steps", "3", "--train.steps", "4", "--resume",
                                   "--cost-model", "m.json", "--collective-timeout", "9"])
    assert a.overrides == [("train.steps", "3"), ("train.steps", "4"), ("train.resume", "true"),
                           ("planner.cost_model", "m.json"), ("train.collective_timeout_s", "9")]
    cfg = load_config(_cfg(tmp_path), a.overrides[:2])
    assert cfg.train.steps == 4  # the last one wins
    b = build_parser().parse_args(["train", "--config", "x", "--train.steps", "4", "--steps", "3"])
    assert load_config(_cfg(tmp_path), b.overrides).train.steps == 3


@pytest.mark.parametrize("over,msg", [
    (("train.stepz", "1"), "--train.stepz: unknown key 'stepz' in [train]; did you mean --train.steps?"),
    (("trian.steps", "1"), "--trian.steps: unknown section [trian]; did you mean train?"),
    (("train.steps", "1.5"), "--train.steps: expected an integer, got '1.5'"),
    (("train.progress", "sure"), "--train.progress: expected true or false"),
    (("optimizer.beta1", "x"), "--optimizer.beta1: expected a number"),
    (("optimizer.beta1", "1.5"), "optimizer.beta1"),  # the dataclass's own range check, as for the file
    (("data.long_docs", "burn"), "[data] long_docs must be one of"),
])
def test_override_errors_are_the_files_one_line_errors(tmp_path, over, msg):
    from tidal.runtime.config import load_config

    with pytest.raises(TidalError) as e:
        load_config(_cfg(tmp_path), [over])
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_toml_unknown_key_names_the_closest(tmp_path):
    from tidal.runtime.config import load_config

    with pytest.raises(TidalError, match=r"unknown key 'stpes'; did you mean steps\?"):
        load_config(_cfg(tmp_path, GOOD.replace("steps = 7", "stpes = 7")))


def test_verify_overrides_apply_to_its_config():
    from tidal.cli.configargs import overrides_of
    from tidal.cli.train import verify_config
    from tidal.runtime.config import with_overrides

    a = build_parser().parse_args(["verify", "--strategies", "4*tp1", "--train.sequence_parallel", "true",
                                   "--planner.packing", "fixed"])
    cfg = with_overrides(verify_config(a), overrides_of(a))
    assert cfg.train.sequence_parallel is True and cfg.planner.packing == "fixed"
    assert cfg.planner.strategies == "4*tp1" and cfg.train.master_dtype == "float64"  # verify's own flags kept
    assert cfg.train.cost_model_warn == 0.0


def test_every_flag_has_help_and_every_command_an_example():
    from tidal.cli.helptext import subparsers

    for path, p in subparsers(build_parser()):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            assert a.help, (path, a.option_strings or a.dest)
        text = p.format_help()
        assert "example:\n  tidal" in text or "torchrun" in text, path
    sub = build_parser()._subparsers._group_actions[0].choices
    assert "(TOML default: 20)" in " ".join(sub["train"].format_help().split())
    assert "(default: 1f1b)" in " ".join(sub["simulate"].format_help().split())


def test_typo_is_an_unknown_flag_not_a_missing_one(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--confg", "x.toml", "--nproc", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "tidal train: error: unknown flag --confg; did you mean --config? (see tidal train --help)"
    with pytest.raises(SystemExit):
        main(["trian"])
    assert "did you mean train?" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no abbreviations: --conf is not --config
        main(["train", "--conf", "x.toml", "--nproc", "2"])
    assert "unknown flag --conf;" in capsys.readouterr().err


def test_plan_config_dry_runs_the_training_job(tmp_path, capsys):
    from tidal.runtime.config import load_config
    from tidal.runtime.train import prepare

    cfg = _cfg(tmp_path)
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(cfg), "--train.steps", "2", "--data.max_len", "128", "--quiet",
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    job = prepare(load_config(cfg, [("data.max_len", "128")]))
    assert plan["model"] == "tiny" and plan["cluster"] == "cpux4"
    assert plan["candidates"] == [str(s) for s in job.candidates]
    assert plan["meta"]["max_len"] == 128 and plan["meta"]["tokens_per_step"] == 1024
    assert plan["meta"]["config"] == str(cfg) and len(plan["steps"]) == 2  # [train] steps, overridden
    assert all(max(s["seq_lengths"]) <= 128 for s in plan["steps"])


def test_simulate_config_plans_tidal_with_the_jobs_candidates(tmp_path):
    cfg = _cfg(tmp_path)
    out = tmp_path / "sim.json"
    assert main(["simulate", "--config", str(cfg), "--steps", "2", "--systems", "tidal", "--quiet",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["meta"]["model"] == "tiny" and res["meta"]["max_len"] == 256 and res["meta"]["steps"] == 2
    assert res["systems"]["tidal"]["config"] == "tp2+2*tp1 ; 4*tp1"
    assert set(res["systems"]["tidal"]["strategies"]) <= {"tp2+2*tp1", "4*tp1"}


def test_cores_warning():
    from tidal.cli.train import cores_warning, usable_cores

    assert cores_warning(2, 2) is None and cores_warning(1, 4) is None
    line = cores_warning(16, 2)
    assert line.startswith("tidal: warning: 16 ranks on 2 cores") and "\n" not in line
    assert usable_cores() >= 1


def test_cost_model_watch():
    from tidal.runtime.calibration import CostModelWatch

    def rows(ratios):
        return [{"predicted_s": 1.0, "measured_s": r} for r in ratios]

    w = CostModelWatch(0.2)
    said = [w.observe(r) for r in rows([5.0, 1.5, 1.6, 1.4, 9.0])]  # the first step is skipped; median of 3 = 1.5
    assert said[:3] == [None] * 3 and said[4] is None
    assert "1.50x its estimate (median of steps 2-4; tolerance 20%)" in said[3] and "tidal profile" in said[3]
    w = CostModelWatch(0.2)
    assert [w.observe(r) for r in rows([5.0, 1.1, 0.9, 1.15])] == [None] * 4  # within 20 %: silent
    w = CostModelWatch(0.2)
    assert w.observe(rows([1.0])[0]) is None and "0.50x" in w.observe(rows([0.5])[0], last=True)  # a short run
    assert CostModelWatch(0.0).observe(rows([9.0])[0], last=True) is None  # 0 disables it


def test_cost_model_watch_names_the_hopper_model(tmp_path, capsys):
    """Decision 158: on Hopper devices the warning about the pools' model names the one that fits the runtime there;
    elsewhere, or with another model named, it adds nothing."""
    from tidal.cli.train import cost_watch
    from tidal.runtime.calibration import CostModelWatch, cost_model_hint
    from tidal.runtime.config import load_config
    from tidal.runtime.job import prepare

    hint = cost_model_hint("", {"h200"})
    assert '"analytic-eager-mixed"' in hint and cost_model_hint("Analytic", {"h100", "h800"}) == hint
    assert cost_model_hint("", {"a800"}) == cost_model_hint("", {"a800", "h800"}) == ""
    assert cost_model_hint("analytic-eager", {"h200"}) == cost_model_hint("", set()) == ""
    rows = [{"predicted_s": 1.0, "measured_s": 1.6}] * 2  # the first measured step is skipped
    w = CostModelWatch(0.2, hint=hint)
    line = [w.observe(rows[0]), w.observe(rows[1], last=True)][1]
    assert line.endswith(hint) and "\n" not in line
    w = CostModelWatch(0.2)
    assert [w.observe(rows[0]), w.observe(rows[1], last=True)][1].endswith('"online"')
    for cluster, said in (("h200x1", True), ("cpux1", False)):  # through `tidal train`'s watch, on the job's cluster
        cfg = load_config(_cfg(tmp_path), [("world.cluster", cluster), ("planner.strategies", "tp1"),
                                           ("train.steps", "2")])
        on_step = cost_watch(prepare(cfg, 1))
        capsys.readouterr()
        for i, r in enumerate(rows):
            on_step({**r, "step": i})
        err = capsys.readouterr().err
        assert "measured compute time is 1.60x" in err and ("analytic-eager-mixed" in err) == said, err


def test_train_plans_with_the_charges_that_plan_config_shows(tmp_path, capsys):
    """Decision 98: `[planner] charges` (default true) reaches the training job's planner (`planner_spec`, which
    `tidal train`/`verify` and the background planner build from), and `tidal plan --config` shows the very steps that
    planner plans; `--planner.charges false` is the ablation."""
    from tidal.costmodel.sync import SyncPricing
    from tidal.runtime.config import load_config
    from tidal.runtime.train import planner_spec, prepare

    cfg = _cfg(tmp_path)
    spec = planner_spec(prepare(load_config(cfg)))
    assert spec.sync == SyncPricing() and spec.charge_cp
    off = planner_spec(prepare(load_config(cfg, [("planner.charges", "false")])))
    assert off.sync is None and not off.charge_cp
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(cfg), "--train.steps", "2", "--quiet", "--json", str(out)]) == 0
    shown = json.loads(out.read_text())
    assert shown["meta"]["charges"] is True
    planner, _ = spec.build()
    trained = [planner.next().plan.to_dict() for _ in range(2)]
    assert [{k: v for k, v in s.items() if k != "plan_ms"} for s in trained] == \
        [{k: v for k, v in s.items() if k != "plan_ms"} for s in shown["steps"]]
    capsys.readouterr()
    assert main(["plan", "--config", str(cfg), "--no-charges"]) == 2
    assert "--planner.charges" in capsys.readouterr().err
