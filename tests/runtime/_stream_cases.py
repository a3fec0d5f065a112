"""Worker body for the pull/push stream test (decision 75): the executor on 4 gloo ranks under several windows and
with or without the push overlapped, each inside a `commcheck.Recorder`."""

from __future__ import annotations

import torch

from tidal.core import get_cluster, get_model, parse_strategy, place
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.runtime.commcheck import Recorder
from tidal.runtime.executor import ExecConfig, Executor
from tidal.runtime.groups import GroupCache
from tidal.runtime.optim import OptimConfig

STRATEGIES = ("pp2+2*tp1", "pp4")  # pushes reduced at roots (3 addends); one addend, sent straight to owners
CONFIGS = (
    {},  # the defaults: pull window 2, push window 2, push overlapped
    {"pull_window": 1, "push_window": 1},
    {"overlap_push": False, "pull_window": 64, "push_window": 64},  # every group posted at once, push after backward
)
MICRO = 4  # micro-batches per pipeline: the push's groups become final in the last one's backward


def _step(strategy, k: int, lengths) -> StepPlan:
    pipes, seqs = [], 0
    for p in strategy.pipelines:
        mbs = tuple((seqs + i,) for i in range(MICRO))
        seqs += MICRO
        pipes.append(PipelinePlan(p.scheme.tp, p.scheme.pp, p.scheme.cp, p.devices, max(lengths), mbs, 0.0,
                                  ("per-doc",) * MICRO if p.scheme.cp > 1 else (), p.scheme.layer_split))
    return StepPlan(tuple(range(seqs)), tuple(lengths[:seqs]), k, tuple(pipes), (), 0.0, 0.0)


def streams_worker(rank: int, world: int) -> list:
    torch.set_num_threads(1)
    spec, cluster = get_model("tiny-tied"), get_cluster(f"cpux{world}")
    cands = [place(parse_strategy(t), cluster, spec) for t in STRATEGIES]
    lengths = [9 + 5 * (i % 4) for i in range(64)]
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, spec.vocab, (n + 1,), generator=g) for n in lengths]
    out = []
    for opts in CONFIGS:
        with Recorder() as rec:
            ex = Executor(spec, cluster, cands, ExecConfig(master_dtype="float64", compute_dtype="float64",
                                                           attn_backend="sdpa", **opts), OptimConfig(), GroupCache())
            overlapped = []
            for k, strategy in enumerate(cands):
                m = ex.train_step(_step(strategy, k, lengths), lambda j: docs[j])
                overlapped.append(m.push_overlapped)
        out.append({"ops": rec.ops, "master": [t.detach().numpy().copy() for t in ex.master], "overlapped": overlapped})
    return out
