"""Tidal as a library (decision 87; docs/library.md): `tidal.Planner` plans one step of a caller's document lengths and
reads back per-pipeline, per-micro-batch assignments; the documented example loop runs."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

from tidal.core.errors import TidalError

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "library_loop.py"


def test_plan_covers_every_sequence_once_and_matches_the_step_plan():
    from tidal import Planner

    p = Planner("tiny", "cpux4", max_len=2048, tokens_per_step=8192, strategies="tp2pp2;cp2+2*tp1;4*tp1")
    assert p.candidates == ("tp2pp2", "cp2+2*tp1", "4*tp1")
    rng = np.random.default_rng(3)
    for _ in range(3):
        lens = [int(x) for x in rng.integers(1, 2049, 12)]
        step = p.plan(lens)
        assert step.strategy in p.candidates and step.est_step_time_s >= step.lower_bound_s * (1 - 1e-9)
        seen = [i for pipe in step.pipelines for mb in pipe.micro_batches for i in mb.sequences]
        assert sorted(seen) == list(range(len(lens)))
        for pipe, raw in zip(step.pipelines, step.plan.pipelines):
            assert pipe.ranks == raw.devices and pipe.tp * pipe.pp * pipe.cp == len(pipe.ranks)
            for mb in pipe.micro_batches:
                assert mb.lengths == tuple(lens[i] for i in mb.sequences)
                assert (mb.cp_sharding in ("per-doc", "per-seq")) == (pipe.cp > 1)
        ranks = sorted(r for pipe in step.pipelines for r in pipe.ranks)
        for r in ranks:  # TP fastest, then CP, then stage (decision 6)
            role = step.role(r)
            pipe = step.pipelines[role.pipeline]
            j = role.stage * pipe.tp * pipe.cp + role.cp_rank * pipe.tp + role.tp_rank
            assert pipe.ranks[j] == r


def test_planner_refuses_bad_input_with_one_line():
    from tidal import Planner

    p = Planner("tiny", "cpux4", max_len=512, tokens_per_step=2048, strategies="4*tp1")
    with pytest.raises(TidalError, match="exceeds max_len 512"):
        p.plan([100, 600])
    with pytest.raises(TidalError, match="WLB"):
        Planner("tiny", "cpux4", max_len=512, tokens_per_step=2048, strategies="4*tp1", packing="wlb")
    with pytest.raises(TidalError, match="needs a sample"):
        Planner("tiny", "cpux4", max_len=512, tokens_per_step=2048)


def test_the_documented_example_runs():
    out = runpy.run_path(str(EXAMPLE), run_name="example")["main"](["--steps", "2", "--max-len", "512",
                                                                  "--tokens-per-step", "2048"])
    assert len(out["losses"]) == 2 and all(np.isfinite(out["losses"]))
    assert out["documents"][0] > 0 and out["candidates"]
