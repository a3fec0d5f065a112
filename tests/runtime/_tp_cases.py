"""Worker bodies for tests/runtime/test_tp_comm.py (spawned gloo ranks): collective counts per decoder layer, and
fused / sequence-parallel tensor parallelism against the one-process reference."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter

import torch
import torch.distributed as dist

from tidal.core import ParallelScheme, PipelinePlan
from tidal.core.strategy import Pipeline
from tidal.runtime.pipeline import GroupCache, RankGrid, build_stage_model, run_pipeline

from _parallel_cases import EQ_LENGTHS, EQ_MBS, EQ_MODES, TINY, TINY_TIED, make_documents, run_case  # isort: skip

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter_single")


@contextlib.contextmanager
def counting(counter: Counter):
    """Count calls of torch.distributed's collectives by name (comm.py looks them up at call time)."""
    saved = {n: getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)}

    def wrap(name, fn):
        def inner(*a, **k):
            counter[name] += 1
            return fn(*a, **k)
        return inner

    for n, fn in saved.items():
        setattr(dist, n, wrap(n, fn))
    try:
        yield counter
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)


def _collapse(c: Counter) -> dict[str, int]:
    out = Counter()
    for k, v in c.items():
        out["reduce_scatter" if k.startswith("reduce_scatter") else "all_gather" if k.startswith("all_gather")
            else k] += v
    return dict(out)


def _counts(rank: int, groups: GroupCache, layers: int, fused: bool, sp: bool) -> dict:
    """Collectives in one forward and one backward of a tp2 stage-less model with `layers` decoder layers."""
    spec = dataclasses.replace(TINY, layers=layers)
    pipe = Pipeline(ParallelScheme(tp=2), (0, 1))
    grid = RankGrid.build(pipe, rank, groups)
    model = build_stage_model(spec, grid, seed=0, attn_backend="sdpa", fused=fused, sequence_parallel=sp)
    model.output = None  # count the decoder layers and the embedding only; the head is outside the layer
    from tidal.models import VarlenBatch

    lengths = [5, 8]
    ids = torch.randint(0, spec.vocab, (sum(lengths),), generator=torch.Generator().manual_seed(0))
    fwd, bwd = Counter(), Counter()
    with counting(fwd):
        h = model(ids, VarlenBatch.from_lengths(lengths))
    with counting(bwd):
        h.float().pow(2).sum().backward()
    return {"fwd": _collapse(fwd), "bwd": _collapse(bwd)}


def counts_worker(rank: int, world: int) -> dict:
    groups = GroupCache().create_all([Pipeline(ParallelScheme(tp=2), (0, 1))])
    out = {}
    for name, fused, sp in (("unfused", False, False), ("fused", True, False), ("sp", True, True)):
        one, two = (_counts(rank, groups, n, fused, sp) for n in (1, 2))
        out[name] = {d: {k: two[d].get(k, 0) - one[d].get(k, 0) for k in set(two[d]) | set(one[d])}
                     for d in ("fwd", "bwd")}
    return out


SP_CASES = (
    ("tp2 sp | tp2 (1,0) sp", [(ParallelScheme(tp=2), (0, 1), TINY), (ParallelScheme(tp=2), (3, 2), TINY_TIED)]),
    ("tp4 sp", [(ParallelScheme(tp=4), (0, 1, 2, 3), TINY)]),
    ("tp2pp2 sp (2,3,1,0)", [(ParallelScheme(tp=2, pp=2, layer_split=(4, 2)), (2, 3, 1, 0), TINY)]),
    ("tp2pp2 tied sp", [(ParallelScheme(tp=2, pp=2), (0, 1, 2, 3), TINY_TIED)]),
    ("tp2cp2 sp (3,1,2,0)", [(ParallelScheme(tp=2, cp=2), (3, 1, 2, 0), TINY)]),
)


def sp_worker(rank: int, world: int) -> dict:
    """Every SP case, and the unfused baseline on tp2, against the one-process reference (errors only)."""
    groups = GroupCache()
    out = {}
    cases = [(n, p, {"sequence_parallel": True}) for n, p in SP_CASES]
    cases.append(("tp2 unfused", [(ParallelScheme(tp=2), (0, 1), TINY)], {"fused": False}))
    for name, pipes, opts in cases:
        r = run_case(rank, pipes, EQ_LENGTHS, EQ_MBS, EQ_MODES, extra_tokens=3, groups=groups, tp_options=opts)
        if r is not None:
            r.pop("grads")
            out[name] = r
    out["accumulate"] = _sp_accumulate(rank, groups)
    return out


def _sp_accumulate(rank: int, groups: GroupCache) -> float:
    """Two run_pipeline calls equal one over both halves under SP (the TP sum of norm gradients adds only each call's
    own contribution)."""
    scheme, devices = ParallelScheme(tp=4), (0, 1, 2, 3)
    pipe = Pipeline(scheme, devices)
    grid = RankGrid.build(pipe, rank, groups.create_all([pipe]))
    docs = make_documents(EQ_LENGTHS, TINY.vocab, seed=1)
    norm = sum(EQ_LENGTHS)

    def plan(mbs):
        return PipelinePlan(4, 1, 1, devices, 16, mbs, 0.0, (), scheme.layer_split)

    once = build_stage_model(TINY, grid, seed=0, attn_backend="sdpa", sequence_parallel=True)
    run_pipeline(once, grid, plan(EQ_MBS), EQ_LENGTHS, docs, global_tokens=norm)
    twice = build_stage_model(TINY, grid, seed=0, attn_backend="sdpa", sequence_parallel=True)
    run_pipeline(twice, grid, plan(EQ_MBS[:2]), EQ_LENGTHS, docs, global_tokens=norm)
    run_pipeline(twice, grid, plan(EQ_MBS[2:]), EQ_LENGTHS, docs, global_tokens=norm)
    a = dict(once.named_parameters())
    return max(float((p.grad - a[n].grad).abs().max() / a[n].grad.abs().max()) for n, p in twice.named_parameters())
