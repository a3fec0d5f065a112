"""Worker for the stage-construction test: each of 2 ranks (a TP pair) builds its shard of stage 1 of a tp2pp4
llama2-7b pipeline in bf16 and reports its resident-memory growth and a few slices to compare."""

from __future__ import annotations

import resource

import torch

from tidal.core import ParallelScheme, get_model
from tidal.core.strategy import Pipeline
from tidal.models.init import derive_seed, init_full
from tidal.runtime.groups import GroupCache
from tidal.runtime.pipeline import RankGrid, build_stage_model

NAMES = ("layers.8.attention.wq.weight", "layers.8.attention.wo.weight", "layers.15.feed_forward.w2.weight",
         "layers.12.ffn_norm.weight")


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def construct_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    spec = get_model("llama2-7b")
    scheme = ParallelScheme(tp=2, pp=4)
    pipeline = Pipeline(scheme, tuple(range(8)))  # this world holds only stage 1's TP pair: ranks 0 and 1
    group = GroupCache().ensure([(0, 1)]).get([0, 1])
    grid = RankGrid(pipeline=pipeline, rank=rank, stage=1, cp_rank=0, tp_rank=rank, tp_group=group, cp_group=None,
                    pipe_group=None, embed_group=None, prev_rank=None, next_rank=None)
    before = _rss_bytes()
    model = build_stage_model(spec, grid, seed=0, attn_backend="sdpa", dtype=torch.bfloat16)
    peak = _rss_bytes()
    shard_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    named = dict(model.named_parameters())
    checks = {}
    for name in NAMES:
        full = init_full(spec, name, derive_seed(0), dtype=torch.bfloat16)
        mine = named[name]
        if mine.shape == full.shape:
            ref = full
        elif mine.shape[0] != full.shape[0]:
            ref = full.chunk(2, dim=0)[rank]
        else:
            ref = full.chunk(2, dim=1)[rank]
        checks[name] = (tuple(mine.shape), bool(torch.equal(mine.detach(), ref)))
    return {"shard_bytes": shard_bytes, "rss_growth": peak - before, "layers": sorted(int(k) for k in model.layers),
            "has_embed": model.tok_embeddings is not None, "has_head": model.output is not None, "checks": checks,
            "full_model_bytes": spec.num_params() * 2}
