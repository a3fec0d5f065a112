"""Bad inputs across every command (issue 25 item 6; decision 81): configs, data files, tokenizers, cost-model files,
checkpoints and absurd arguments. Each must end with exit code 2 (docs/training.md, "Exit codes") and exactly one
line on stderr, never a traceback, and before any process starts (a rank, the background planner or a profiler
worker: starting one fails the test)."""

from __future__ import annotations

import json
import multiprocessing.process

import pytest

from tidal.cli.main import main
from tidal.core.errors import EXIT_INPUT

from _tiny_config import tiny_toml  # isort: skip

pytestmark = [pytest.mark.reliability, pytest.mark.unit]

GOOD = tiny_toml(optimizer=True, train="steps = 2\nprogress = false\n")


@pytest.fixture
def no_process(monkeypatch):
    """Any process start (ranks, the planner, profiler workers) fails the test: refusals come first."""

    def refuse(self):
        raise AssertionError(f"a process was started ({self.name}) for an input that must be refused")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)


def files(tmp):
    """Bad files every case may point at."""
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (tmp / "empty.txt").write_text("")
    (tmp / "garbage.json").write_text("{not json")
    (tmp / "list.json").write_text("[1, 2, 3]")
    (tmp / "wrong.json").write_text(json.dumps({"kind": "nothing", "coefficients": "x"}))
    (tmp / "adir").mkdir(exist_ok=True)
    (tmp / "docs.jsonl").write_text('{"text": "hello world"}\n' * 4)
    (tmp / "nofield.jsonl").write_text('{"body": "hello"}\n' * 4)
    (tmp / "badlines.jsonl").write_text("not json at all\n{also not\n")
    (tmp / "notok.json").write_text(json.dumps({"model": {"type": "Nonsense"}}))
    return tmp


def cfg(edit=None, extra=(), name="c.toml"):
    """A `tidal train` case: GOOD edited by `edit(text, tmp)`, then `extra` arguments (default --nproc 4)."""

    def build(tmp):
        text = GOOD if edit is None else edit(GOOD, tmp)
        p = tmp / name
        if text is not None:
            p.write_text(text)
        return ["train", "--config", str(p)] + list(extra or ["--nproc", "4"])

    return build


def plan_cfg(*extra, command="plan"):
    """A `tidal plan --config` (dry-run) case on GOOD."""

    def build(tmp):
        (tmp / "c.toml").write_text(GOOD)
        return [command, "--config", str(tmp / "c.toml"), *extra]

    return build


def sub(old, new):
    return lambda t, _tmp: t.replace(old, new)


def add(section, line):
    return lambda t, _tmp: t.replace(f"[{section}]\n", f"[{section}]\n{line}\n")


def ckpt(setup):
    """A resume case: checkpoint_dir prepared by `setup(dir)`."""

    def edit(t, tmp):
        d = tmp / "ck"
        d.mkdir(exist_ok=True)
        setup(d)
        return t.replace("[train]\n", f'[train]\nresume = true\ncheckpoint_dir = "{d}"\n')

    return edit


def _meta(d, **over):
    (d / "step-000002").mkdir(exist_ok=True)
    meta = {"format": "tidal-checkpoint/1", "model": {"name": "tiny"}, "step": 2, "params": []}
    meta.update(over)
    (d / "step-000002" / "meta.json").write_text(json.dumps(meta))
    (d / "latest").write_text("step-000002\n")


def cost_model(name):
    return lambda t, tmp: t.replace("[planner]\n", f'[planner]\ncost_model = "{tmp}/{name}"\n')


def argv(*a):
    return lambda tmp: [x.format(tmp=tmp) for x in a]


CASES = [
    # ---- tidal train: optimizer values (non-finite and absurd) ----
    *[(f"optimizer {k}={v}", cfg(add("optimizer", f"{k} = {v}") if k != "lr" else sub("lr = 1e-3", f"lr = {v}")))
      for k, vs in (("lr", ("nan", "inf", "-inf", "1e9", "-1.0", "0.0", "2.0")),
                    ("eps", ("nan", "inf", "0.0", "-1e-8", "5.0")),
                    ("clip", ("nan", "inf", "-1.0")),
                    ("beta1", ("nan", "1.0", "-0.1", "inf")),
                    ("beta2", ("nan", "1.5", "-inf")),
                    ("weight_decay", ("nan", "-0.1", "5.0", "inf")),
                    ("min_lr_ratio", ("nan", "2.0")),
                    ("warmup_steps", ("-1",)), ("decay_steps", ("0",)))
      for v in vs],
    # ---- tidal train: data, train, planner sections ----
    ("max_len 1", cfg(sub("max_len = 128", "max_len = 1"))),
    ("max_len 0", cfg(sub("max_len = 128", "max_len = 0"))),
    ("max_len negative", cfg(sub("max_len = 128", "max_len = -5"))),
    ("max_len 15", cfg(sub("max_len = 128", "max_len = 15"))),
    ("max_len huge", cfg(sub("max_len = 128", "max_len = 10000000"))),
    ("tokens_per_step 0", cfg(sub("tokens_per_step = 512", "tokens_per_step = 0"))),
    ("tokens_per_step 1e12", cfg(sub("tokens_per_step = 512", "tokens_per_step = 1000000000000"))),
    ("tokens_per_step float", cfg(sub("tokens_per_step = 512", "tokens_per_step = 5e2"))),
    ("long_docs unknown", cfg(add("data", 'long_docs = "explode"'))),
    ("data seed negative", cfg(add("data", "seed = -1"))),
    ("planner name unknown", cfg(add("planner", 'name = "megatron"'))),
    ("flexpipe depths without flexpipe", cfg(add("planner", 'flexpipe_depths = "1,2"'))),
    ("flexpipe depth beyond layers", cfg(add("planner", 'name = "flexpipe"\nflexpipe_depths = "1,7"'))),
    ("flexpipe depths not integers", cfg(add("planner", 'name = "flexpipe"\nflexpipe_depths = "1,x"'))),
    ("corpus unknown", cfg(sub('"stdlib:defs"', '"webtext"'))),
    ("corpus jsonl missing", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/nope.jsonl"'))),
    ("corpus jsonl empty", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/empty.txt"'))),
    ("corpus jsonl binary", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/binary.bin"'))),
    ("corpus jsonl bad lines", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/badlines.jsonl"'))),
    ("corpus jsonl no field", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/nofield.jsonl"'))),
    ("corpus random lengths missing", cfg(lambda t, tmp: t.replace('"stdlib:defs"',
                                                                    f'"random:lengths:{tmp}/nope.txt"'))),
    ("corpus random lengths binary", cfg(lambda t, tmp: t.replace('"stdlib:defs"',
                                                                   f'"random:lengths:{tmp}/binary.bin"'))),
    ("tokenizer missing", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/docs.jsonl"')
                              .replace("[data]\n", f'[data]\ntokenizer = "{tmp}/nope.json"\n'))),
    ("tokenizer garbage", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/docs.jsonl"')
                              .replace("[data]\n", f'[data]\ntokenizer = "{tmp}/garbage.json"\n'))),
    ("tokenizer binary", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/docs.jsonl"')
                             .replace("[data]\n", f'[data]\ntokenizer = "{tmp}/binary.bin"\n'))),
    ("tokenizer not a tokenizer", cfg(lambda t, tmp: t.replace('"stdlib:defs"', f'"jsonl:{tmp}/docs.jsonl"')
                                      .replace("[data]\n", f'[data]\ntokenizer = "{tmp}/notok.json"\n'))),
    ("steps 0", cfg(sub("steps = 2", "steps = 0"))),
    ("steps negative", cfg(sub("steps = 2", "steps = -3"))),
    ("train seed negative", cfg(add("train", "seed = -1"))),
    ("collective_timeout inf", cfg(add("train", "collective_timeout_s = inf"))),
    ("collective_timeout nan", cfg(add("train", "collective_timeout_s = nan"))),
    ("collective_timeout 0", cfg(add("train", "collective_timeout_s = 0"))),
    ("stop_grace negative", cfg(add("train", "stop_grace_s = -1"))),
    ("max_consecutive_skips 0", cfg(add("train", "max_consecutive_skips = 0"))),
    ("inject_nan garbage", cfg(add("train", 'inject_nan = "soon"'))),
    ("refit unknown", cfg(add("train", 'refit = "sometimes"'))),
    ("refit_every 0", cfg(add("train", "refit_every = 0"))),
    ("checkpoint_every negative", cfg(add("train", "checkpoint_every = -1"))),
    ("checkpoint_every without dir", cfg(add("train", "checkpoint_every = 2"))),
    ("resume without dir", cfg(add("train", "resume = true"))),
    ("gc_every negative", cfg(add("train", "gc_every = -1"))),
    ("plan_ahead negative", cfg(add("train", "plan_ahead = -1"))),
    ("master dtype bf16", cfg(add("train", 'master_dtype = "bfloat16"'))),
    ("compute dtype int8", cfg(add("train", 'compute_dtype = "int8"'))),
    ("schedule unknown", cfg(add("train", 'schedule = "zigzag"'))),
    ("recompute unknown", cfg(add("train", 'recompute = "full,most"'))),
    ("recompute with a cost model file", cfg(lambda t, tmp: t.replace("[train]\n", '[train]\nrecompute = "full"\n')
                                             .replace("[planner]\n", f'[planner]\ncost_model = "{tmp}/cm.json"\n'))),
    ("metrics dir missing", cfg(lambda t, tmp: t.replace("[train]\n", f'[train]\nmetrics = "{tmp}/no/m.jsonl"\n'))),
    ("metrics is a directory", cfg(lambda t, tmp: t.replace("[train]\n", f'[train]\nmetrics = "{tmp}/adir"\n'))),
    ("attention backend unknown", cfg(sub('attn_backend = "sdpa"', 'attn_backend = "flash9"'))),
    ("compile mode unknown", cfg(add("model", 'compile = "max-autotune"'))),
    ("model unknown", cfg(sub('name = "tiny"', 'name = "gpt-9"'))),
    ("cluster unknown", cfg(sub('cluster = "cpux4"', 'cluster = "quantumx4"'))),
    ("cluster size 0", cfg(sub('cluster = "cpux4"', 'cluster = "cpux0"'))),
    ("strategies garbage", cfg(sub('"tp2+2*tp1;4*tp1"', '"tpx+banana"'))),
    ("strategies need 8", cfg(sub('"tp2+2*tp1;4*tp1"', '"8*tp1"'))),
    ("strategies TP vs heads", cfg(sub('"tp2+2*tp1;4*tp1"', '"tp4;tp3+tp1"'))),
    ("packing unknown", cfg(add("planner", 'packing = "tetris"'))),
    ("cp_sharding unknown", cfg(add("planner", 'cp_sharding = "diagonal"'))),
    ("cost model missing", cfg(cost_model("no.json"))),
    ("cost model garbage", cfg(cost_model("garbage.json"))),
    ("cost model binary", cfg(cost_model("binary.bin"))),
    ("cost model a list", cfg(cost_model("list.json"))),
    ("cost model wrong", cfg(cost_model("wrong.json"))),
    ("cost model directory", cfg(cost_model("adir"))),
    # ---- tidal train: the file itself ----
    ("unknown key", cfg(sub("steps = 2", "stepz = 2"))),
    ("unknown section", cfg(lambda t, _tmp: t + "\n[trainer]\nx = 1\n")),
    ("wrong type", cfg(sub("steps = 2", 'steps = "two"'))),
    ("bool for int", cfg(sub("steps = 2", "steps = true"))),
    ("section not a table", cfg(lambda t, _tmp: "model = 3\n")),
    ("malformed TOML", cfg(sub("[world]", "[world"))),
    ("config missing", cfg(lambda t, _tmp: None, name="missing.toml")),
    ("config binary", lambda tmp: ["train", "--config", str(tmp / "binary.bin"), "--nproc", "4"]),
    ("config is a directory", lambda tmp: ["train", "--config", str(tmp / "adir"), "--nproc", "4"]),
    # ---- tidal train: checkpoints to resume from ----
    ("resume: empty dir", cfg(ckpt(lambda d: None))),
    ("resume: latest names nothing", cfg(ckpt(lambda d: (d / "latest").write_text("step-000009\n")))),
    ("resume: latest is binary", cfg(ckpt(lambda d: (d / "latest").write_bytes(b"\xff\xfe\x00\x01")))),
    ("resume: meta garbage", cfg(ckpt(lambda d: (_meta(d), (d / "step-000002" / "meta.json").write_text("{x"))))),
    ("resume: meta other format", cfg(ckpt(lambda d: _meta(d, format="other/9")))),
    ("resume: other model", cfg(ckpt(lambda d: _meta(d, params=[{"name": "w", "shape": [3]}])))),
    # ---- tidal train: arguments ----
    ("nproc mismatch", cfg(extra=["--nproc", "2"])),
    ("nproc missing", cfg(extra=["--steps", "2"])),
    ("nproc zero", cfg(extra=["--nproc", "0"])),
    ("timeout inf", cfg(extra=["--nproc", "4", "--timeout", "inf"])),
    ("timeout nan", cfg(extra=["--nproc", "4", "--timeout", "nan"])),
    ("timeout negative", cfg(extra=["--nproc", "4", "--timeout", "-5"])),
    ("collective timeout 0", cfg(extra=["--nproc", "4", "--collective-timeout", "0"])),
    ("steps not a number", cfg(extra=["--nproc", "4", "--steps", "abc"])),
    ("steps override 0", cfg(extra=["--nproc", "4", "--steps", "0"])),
    ("checkpoint-every text", cfg(extra=["--nproc", "4", "--checkpoint-every", "x"])),
    ("refit choice", cfg(extra=["--nproc", "4", "--refit", "always"])),
    ("unknown flag", cfg(extra=["--nproc", "4", "--fast"])),
    # ---- --section.key overrides (decision 87): the file's own one-line errors ----
    ("override unknown key", cfg(extra=["--nproc", "4", "--train.stepz", "3"])),
    ("override unknown section", cfg(extra=["--nproc", "4", "--trainer.steps", "3"])),
    ("override not an int", cfg(extra=["--nproc", "4", "--train.steps", "three"])),
    ("override not a bool", cfg(extra=["--nproc", "4", "--train.resume", "maybe"])),
    ("override not a number", cfg(extra=["--nproc", "4", "--optimizer.lr", "fast"])),
    ("override lr nan", cfg(extra=["--nproc", "4", "--optimizer.lr", "nan"])),
    ("override max_len 3", cfg(extra=["--nproc", "4", "--data.max_len", "3"])),
    ("override steps 0", cfg(extra=["--nproc", "4", "--train.steps", "0"])),
    ("override packing", cfg(extra=["--nproc", "4", "--planner.packing", "tetris"])),
    ("override cluster vs nproc", cfg(extra=["--nproc", "4", "--world.cluster", "cpux2"])),
    ("override missing value", cfg(extra=["--nproc", "4", "--train.steps"])),
    ("override cost_model_warn", cfg(extra=["--nproc", "4", "--train.cost_model_warn", "-1"])),
    ("typo of --config", lambda tmp: ["train", "--confg", str(tmp / "c.toml"), "--nproc", "4"]),
    ("verify override key", argv("verify", "--strategies", "4*tp1", "--data.maxlen", "64")),
    ("verify override value", argv("verify", "--strategies", "4*tp1", "--train.steps", "x")),
    # ---- tidal verify ----
    ("verify steps 0", argv("verify", "--strategies", "4*tp1", "--steps", "0")),
    ("verify nproc 0", argv("verify", "--strategies", "4*tp1", "--nproc", "0")),
    ("verify dtype", argv("verify", "--strategies", "4*tp1", "--dtype", "int8")),
    ("verify max-len 1", argv("verify", "--strategies", "4*tp1", "--max-len", "1")),
    ("verify tokens 0", argv("verify", "--strategies", "4*tp1", "--tokens-per-step", "0")),
    ("verify strategies", argv("verify", "--strategies", "banana")),
    ("verify data", argv("verify", "--strategies", "4*tp1", "--data", "nope")),
    ("verify model", argv("verify", "--strategies", "4*tp1", "--model", "gpt-9")),
    ("verify seed", argv("verify", "--strategies", "4*tp1", "--seed", "-1")),
    ("verify no strategies", argv("verify")),
    ("verify flexpipe depth beyond nproc", argv("verify", "--planner", "flexpipe", "--flexpipe-depths", "8")),
    # ---- tidal plan ----
    ("plan max-len 1", argv("plan", "--max-len", "1")),
    ("plan max-len 8", argv("plan", "--max-len", "8", "--model", "tiny", "--cluster", "cpux4")),
    ("plan max-len 0", argv("plan", "--max-len", "0")),
    ("plan tokens 1e12", argv("plan", "--tokens-per-step", "1000000000000")),
    ("plan tokens text", argv("plan", "--tokens-per-step", "lots")),
    ("plan model", argv("plan", "--model", "gpt-9")),
    ("plan cluster", argv("plan", "--cluster", "quantumx4")),
    ("plan data", argv("plan", "--data", "nope")),
    ("plan data missing file", argv("plan", "--data", "jsonl:{tmp}/nope.jsonl")),
    ("plan strategies", argv("plan", "--strategies", "banana")),
    ("plan cost model missing", argv("plan", "--cost-model", "{tmp}/nope.json")),
    ("plan cost model garbage", argv("plan", "--cost-model", "{tmp}/garbage.json")),
    ("plan cost model binary", argv("plan", "--cost-model", "{tmp}/binary.bin")),
    ("plan json dir missing", argv("plan", "--json", "{tmp}/no/plan.json", "--model", "tiny", "--cluster", "cpux4",
                                   "--max-len", "256", "--tokens-per-step", "1024", "--steps", "1")),
    ("plan budget nan", argv("plan", "--plan-budget-ms", "nan")),
    ("plan budget negative", argv("plan", "--plan-budget-ms", "-1")),
    ("plan budget inf", argv("plan", "--plan-budget-ms", "inf")),
    ("plan steps 0", argv("plan", "--steps", "0")),
    ("plan seed", argv("plan", "--seed", "-2")),
    ("plan packing", argv("plan", "--packing", "tetris")),
    ("plan override without config", argv("plan", "--data.max_len", "4096")),
    ("plan --config missing", argv("plan", "--config", "{tmp}/nope.toml")),
    ("plan --config bad override", argv("plan", "--config", "{tmp}/nope.toml", "--planner.stratgies", "tp1")),
    ("plan --config and --model", plan_cfg("--model", "tiny")),
    ("plan --config and --max-len", plan_cfg("--max-len", "4096")),
    ("simulate --config bad override", plan_cfg("--data.long_docs", "burn", command="simulate")),
    # ---- tidal simulate ----
    ("simulate max-len 1", argv("simulate", "--max-len", "1")),
    ("simulate tokens 1e12", argv("simulate", "--tokens-per-step", "1000000000000")),
    ("simulate fwd-share nan", argv("simulate", "--fwd-share", "nan")),
    ("simulate fwd-share 2", argv("simulate", "--fwd-share", "2")),
    ("simulate systems", argv("simulate", "--systems", "skynet")),
    ("simulate gantt step", argv("simulate", "--gantt-step", "-1")),
    ("simulate gantt system", argv("simulate", "--gantt-system", "skynet")),
    ("simulate cost model", argv("simulate", "--cost-model", "{tmp}/garbage.json")),
    ("simulate report is a file", argv("simulate", "--report", "{tmp}/empty.txt")),
    ("simulate json dir missing", argv("simulate", "--json", "{tmp}/no/x.json")),
    ("simulate model", argv("simulate", "--model", "gpt-9")),
    # ---- tidal demo ----
    ("demo steps 0", argv("demo", "--steps", "0")),
    ("demo nproc 0", argv("demo", "--nproc", "0")),
    ("demo max-len 1", argv("demo", "--max-len", "1")),
    ("demo tokens 0", argv("demo", "--tokens-per-step", "0")),
    ("demo data", argv("demo", "--data", "nope")),
    ("demo out is a file", argv("demo", "--out", "{tmp}/empty.txt")),
    ("demo memory 0", argv("demo", "--memory-gib", "0")),
    ("demo memory nan", argv("demo", "--memory-gib", "nan")),
    ("demo sim-steps negative", argv("demo", "--sim-steps", "-1")),
    # ---- tidal profile ----
    ("profile model", argv("profile", "--model", "gpt-9")),
    ("profile cluster", argv("profile", "--cluster", "quantumx4")),
    ("profile repeats 0", argv("profile", "--repeats", "0")),
    ("profile compile unknown", argv("profile", "--compile", "all")),
    ("profile totals", argv("profile", "--totals", "abc")),
    ("profile totals negative", argv("profile", "--totals", "-5")),
    ("profile schemes", argv("profile", "--schemes", "banana")),
    ("profile out dir", argv("profile", "--out", "{tmp}/no/p.json")),
    ("profile attn", argv("profile", "--attn-backend", "flash9")),
    ("profile dtype", argv("profile", "--dtype", "int8")),
    ("profile timeout inf", argv("profile", "--timeout", "inf")),
    ("profile memory nan", argv("profile", "--memory-gib", "nan")),
    ("profile memory negative", argv("profile", "--memory-gib", "-1")),
    ("profile data", argv("profile", "--data", "nope")),
    ("profile draws 0", argv("profile", "--data", "stdlib:defs", "--draws", "0")),
    ("profile max-doc 0", argv("profile", "--max-doc", "0")),
    # ---- tidal report calibration ----
    ("report missing", argv("report", "calibration", "{tmp}/nope.jsonl")),
    ("report binary", argv("report", "calibration", "{tmp}/binary.bin")),
    ("report empty", argv("report", "calibration", "{tmp}/empty.txt")),
    ("report garbage", argv("report", "calibration", "{tmp}/badlines.jsonl")),
    ("report not metrics", argv("report", "calibration", "{tmp}/docs.jsonl")),
    ("report directory", argv("report", "calibration", "{tmp}/adir")),
    ("report skip negative", argv("report", "calibration", "{tmp}/docs.jsonl", "--skip", "-1")),
    ("report cost model", argv("report", "calibration", "{tmp}/docs.jsonl", "--cost-model", "{tmp}/garbage.json")),
    # ---- tidal tokenizer ----
    ("tokenizer vocab small", argv("tokenizer", "train", "--input", "{tmp}/docs.jsonl", "--vocab", "10", "--out",
                                   "{tmp}/t.json")),
    ("tokenizer input missing", argv("tokenizer", "train", "--input", "{tmp}/nope.txt", "--vocab", "300", "--out",
                                     "{tmp}/t.json")),
    ("tokenizer out is a dir", argv("tokenizer", "train", "--input", "{tmp}/docs.jsonl", "--vocab", "300", "--out",
                                    "{tmp}/adir")),
    ("tokenizer index data", argv("tokenizer", "index", "--data", "nope")),
    ("tokenizer index tok missing", argv("tokenizer", "index", "--data", "jsonl:{tmp}/docs.jsonl", "--tokenizer",
                                         "{tmp}/nope.json")),
    ("tokenizer index tok garbage", argv("tokenizer", "index", "--data", "jsonl:{tmp}/docs.jsonl", "--tokenizer",
                                         "{tmp}/garbage.json")),
    # ---- the command line itself ----
    ("no command", argv()),
    ("unknown command", argv("fly")),
]


def test_at_least_a_hundred_cases():
    assert len(CASES) >= 100
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,build", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2_before_any_process(tmp_path, capsys, no_process, name, build):
    args = build(files(tmp_path))
    try:
        code = main(args)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_INPUT, (name, code, err)
    assert len(err) == 1 and err[0].startswith("tidal"), (name, err)
    assert "Traceback" not in err[0] and "internal error" not in err[0], (name, err)
