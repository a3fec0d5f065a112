"""Resharding on real gloo ranks. One spawn per test: every rank loops over the seeded cases, executes the plans with
torch.distributed and checks its result; results are agreed with all_gather_object.

All values are small integers in float64, so reductions of partial addends are exact: the tolerance is zero.
"""

import pytest
import torch
import torch.distributed as dist

from tidal.runtime.launch import run_distributed
from tidal.runtime.reshard import Resolver, TensorMove, Topology
from tidal.runtime.reshard.execute import GroupCache, execute
from tidal.runtime.reshard.testing import check, random_case

pytestmark = [pytest.mark.reshard, pytest.mark.distributed]

WORLD = 8
CASES = 240
FUSED_EVERY = 8  # every 8th step also runs three cases fused into one plan


def _gather_check(rank, dst, value, local):
    """Every rank's output gathered; checked against the reference layout (exact)."""
    outs = [None] * dist.get_world_size()
    dist.all_gather_object(outs, None if local is None else local.numpy())
    return check(dst, value, {r: o for r, o in enumerate(outs) if o is not None})


def _property_worker(rank, world, cases):
    resolver = Resolver(Topology.uniform(world, 4), itemsize=8)
    groups = GroupCache()
    fallback = GroupCache(reduce_scatter="allreduce")
    failures, stats = [], {"cases": 0, "fused": 0, "rs_fallback": 0, "partial_src": 0, "hetero": 0, "nonuniform": 0}
    for seed in range(cases):
        shape, src, dst, value, shards = random_case(seed, world)
        plan = resolver.plan([TensorMove(src, dst, shape)])
        x = torch.from_numpy(shards[rank]) if rank in shards else None
        out = execute(plan, [x], groups, dtype=torch.float64)[0]
        err = _gather_check(rank, dst, value, out)
        if err:
            failures.append(f"seed {seed}: {src} -> {dst} {shape}: {err}")
        stats["cases"] += 1
        stats["partial_src"] += src.is_partial()
        stats["hetero"] += src.hsize > 1 or dst.hsize > 1
        stats["nonuniform"] += src.hweights is not None or dst.hweights is not None
        if any(c.kind == "RS" for c in plan.collectives):  # same plan through the all-reduce fallback
            out = execute(plan, [x], fallback, dtype=torch.float64)[0]
            err = _gather_check(rank, dst, value, out)
            stats["rs_fallback"] += 1
            if err:
                failures.append(f"seed {seed} (reduce-scatter fallback): {err}")
        if seed % FUSED_EVERY == 0:
            trio = [random_case(10_000 + seed + k, world) for k in range(3)]
            plan = resolver.plan([TensorMove(s, d, sh) for sh, s, d, _, _ in trio], fused=True)
            xs = [torch.from_numpy(c[4][rank]) if rank in c[4] else None for c in trio]
            outs = execute(plan, xs, groups, dtype=torch.float64)
            for (sh, s, d, v, _), o in zip(trio, outs):
                err = _gather_check(rank, d, v, o)
                if err:
                    failures.append(f"fused case at {seed}: {s} -> {d} {sh}: {err}")
            stats["fused"] += 1
    return failures, stats, len(groups)


def test_random_annotation_pairs_on_8_gloo_ranks():
    results = run_distributed(_property_worker, WORLD, CASES, timeout_s=60)
    failures, stats, ngroups = results[0]
    assert all(r[0] == failures for r in results)
    assert not failures, "\n".join(failures[:10])
    assert stats["cases"] >= 200 and stats["fused"] >= 25
    assert stats["partial_src"] >= 40 and stats["hetero"] >= 100 and stats["nonuniform"] >= 20
    assert stats["rs_fallback"] >= 1
    print(f"reshard property: {stats}, process groups created: {ngroups}")
