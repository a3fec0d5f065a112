"""`[planner] refine` (decision 101): the proposal's local search (decision 99) in `tidal plan`, `tidal train` /
`tidal verify` and the dry runs, as the simulator's `tidal` system runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tidal.cli.main import main
from tidal.core.errors import TidalError

pytestmark = pytest.mark.unit

# llama2-7b on 8 A800s, proposed from the synthetic commoncrawl lengths (the cells decision 99 refined)
TOML = ('[model]\nname = "llama2-7b"\n[world]\ncluster = "a800x8"\n'
        '[data]\nsource = "random:synthetic:commoncrawl"\nmax_len = 16384\ntokens_per_step = 40000\nseed = 2\n'
        '[planner]\nstrategies = "auto"\n{extra}[train]\nsteps = 1\nprogress = false\n')


def _cfg(tmp_path, extra=""):
    p = tmp_path / "train.toml"
    p.write_text(TOML.format(extra=extra))
    return p


def test_refine_key_validates_and_reaches_the_config(tmp_path, capsys):
    from tidal.runtime.config import load_config

    cfg = _cfg(tmp_path)
    assert load_config(cfg).planner.refine is True  # the default: as the simulator's tidal system
    assert load_config(cfg, [("planner.refine", "false")]).planner.refine is False
    with pytest.raises(TidalError) as e:
        load_config(cfg, [("planner.refine", "maybe")])
    assert "refine" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TidalError) as e:
        load_config(_cfg(tmp_path, "refine = 3\n"))
    assert "refine" in str(e.value) and "\n" not in str(e.value)
    capsys.readouterr()
    assert main(["plan", "--config", str(cfg), "--no-refine"]) == 2  # one source per setting: the override
    err = capsys.readouterr().err
    assert "--planner.refine" in err and len(err.strip().splitlines()) == 1


def test_plan_refine_holds_max_len_is_deterministic_and_no_worse(tmp_path):
    """`tidal plan --config` proposes with refine by default (meta `refine`), as `prepare` (what `tidal train` and
    `tidal verify` plan with) does, deterministically for the seed; some candidate runs a max_len document; and the
    refined candidates' best single strategy, on the steps the refine search samples, is never worse than the plain
    proposal's (`--planner.refine false`): the refined pool holds the plain one (decision 99's property for propose,
    here through the job)."""
    from tidal.costmodel.base import pipeline_device
    from tidal.planner.proposal import EVAL_STEPS
    from tidal.planner.proposal_search import ProfileCache, evaluate, sample_steps
    from tidal.runtime.config import load_config
    from tidal.runtime.job import PROPOSAL_SAMPLE, open_corpus, prepare

    cfg = _cfg(tmp_path)
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(cfg), "--quiet", "--json", str(out)]) == 0
    shown = json.loads(out.read_text())
    assert shown["meta"]["refine"] is True and shown["meta"]["charges"] is True
    on = prepare(load_config(cfg))
    off = prepare(load_config(cfg, [("planner.refine", "false")]))
    assert tuple(shown["candidates"]) == tuple(str(s) for s in on.candidates)  # deterministic for the seed
    assert [str(s) for s in on.candidates] != [str(s) for s in off.candidates]  # the search found another set
    cm = on.cost_model()
    for job in (on, off):
        assert any(max(cm.max_len(p.scheme, pipeline_device(cm.cluster, p)) for p in st.pipelines) >= 16384
                   for st in job.candidates)
    d = on.config.data
    src = open_corpus(on.config, on.spec).length_source()
    sample = np.minimum(src.lengths(0, PROPOSAL_SAMPLE), d.max_len)
    steps = sample_steps(sample, d.tokens_per_step, d.max_len, EVAL_STEPS, d.seed, long_step=True)
    sync, policy = on.charges

    def best(job):
        E = evaluate(steps, job.candidates, ProfileCache(cm, sync, policy), d.seed)
        means = [float(row.mean()) for row in E if np.all(np.isfinite(row))]
        return min(means)

    assert best(on) <= best(off) * (1 + 1e-12)


def test_plan_no_refine_flag_is_recorded(tmp_path):
    out = tmp_path / "p.json"
    args = ["plan", "--model", "tiny", "--cluster", "cpux4", "--max-len", "1024", "--tokens-per-step", "4096",
            "--steps", "1", "--quiet", "--json", str(out)]
    assert main([*args, "--no-refine"]) == 0
    assert json.loads(out.read_text())["meta"]["refine"] is False
    assert main(args) == 0
    assert json.loads(out.read_text())["meta"]["refine"] is True


def test_library_planner_refines_as_tidal_plan():
    """`tidal.Planner(refine=)` proposes the candidates `build_candidates(refine=)` does (charged, as `tidal plan`)."""
    from tidal.api import Planner
    from tidal.costmodel.sync import SyncPricing
    from tidal.data.sources import length_source
    from tidal.planner.stepper import build_candidates

    sample = length_source("synthetic:commoncrawl", 0).lengths(0, 2000)
    kw = dict(max_len=2048, tokens_per_step=8192)
    for refine in (True, False):
        p = Planner("tiny", "cpux8", sample_lengths=sample, refine=refine, **kw)
        want = build_candidates(p.cost_model, "auto", sample, seed=0, sync=SyncPricing(), cp_policy="adaptive",
                                refine=refine, **kw)
        assert p.candidates == tuple(str(s) for s in want)
