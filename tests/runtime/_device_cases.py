"""Worker body of test_device_check.py's runtime test (spawned gloo ranks): build each case's stage model and run its
pipeline's forward and backward under the DeviceChecker; return the findings.

The one host read the step makes (docs/runtime.md lists it): ``float(loss)`` once per step in run_pipeline (the
reported loss)."""

from __future__ import annotations

import torch

from tidal.core import ParallelScheme, PipelinePlan
from tidal.core.strategy import Pipeline
from tidal.runtime.pipeline import GroupCache, RankGrid, build_stage_model, run_pipeline

from _devicecheck import DeviceChecker  # isort: skip
from _parallel_cases import EQ_LENGTHS, EQ_MBS, EQ_MODES, TINY, TINY_TIED, make_documents  # isort: skip

# name -> (pipelines (scheme, devices, model) over world 4, build options, schedule)
CASES = (
    ("tp2cp2 (3,1,2,0) tied", [(ParallelScheme(tp=2, cp=2), (3, 1, 2, 0), TINY_TIED)], {}, "1f1b"),
    ("tp2pp2 sequence-parallel", [(ParallelScheme(tp=2, pp=2), (0, 1, 2, 3), TINY)], {"sequence_parallel": True},
     "1f1b"),
    ("pp2cp2 tied", [(ParallelScheme(pp=2, cp=2), (0, 1, 2, 3), TINY_TIED)], {}, "1f1b"),
    ("tp4 unfused", [(ParallelScheme(tp=4), (0, 1, 2, 3), TINY)], {"fused": False}, "1f1b"),
    ("pp2 tied | cp2, gpipe", [(ParallelScheme(pp=2), (0, 1), TINY_TIED), (ParallelScheme(cp=2), (2, 3), TINY)], {},
     "gpipe"),
)


def runtime_worker(rank: int, world: int) -> list[tuple[str, list]]:
    torch.set_num_threads(1)
    groups = GroupCache()
    out = []
    for name, pipes, opts, schedule in CASES:
        groups.create_all([Pipeline(s, d) for s, d, _ in pipes])
        scheme, devices, spec = next(p for p in pipes if rank in p[1])
        grid = RankGrid.build(Pipeline(scheme, devices), rank, groups)
        docs = make_documents(EQ_LENGTHS, spec.vocab, seed=1)
        plan = PipelinePlan(scheme.tp, scheme.pp, scheme.cp, devices, max(EQ_LENGTHS), EQ_MBS, 0.0,
                            EQ_MODES if scheme.cp > 1 else (), scheme.layer_split)
        with DeviceChecker() as build:  # construction: devices only (host reads are fine there)
            model = build_stage_model(spec, grid, seed=0, attn_backend="sdpa", device="cpu", **opts)
        with DeviceChecker(host_reads=True) as step:
            run_pipeline(model, grid, plan, EQ_LENGTHS, docs, schedule=schedule)
        assert all(p.grad is not None for p in model.parameters())
        out.append((name, build.findings + step.findings))
    return out
