"""Resharding figures: a strategy switch shaped like Hetu v2 §8 Table 2 (C1 -> C2, one GPU dropped, heterogeneous
stage TP) on a modelled two-node topology, Hydraulis' pull/push volumes against the App. B.1 bound, and planning
times for a 32-layer model. Prints tables; asserts nothing.

    python benchmarks/reshard.py [--model llama2-7b] [--repeats 5] [--execute]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from tidal.core import get_cluster, get_model, parse_strategy, place
from tidal.runtime.reshard import Topology
from tidal.runtime.reshard.deduce import Stage, model_param_shapes
from tidal.runtime.reshard.switch import SwitchPlanner, pull_moves, push_moves

MB = 1e6


def c1_c2(model):
    """C1: two pipelines tp4 x 2 stages, one per node. C2: rank 15 leaves; the second pipeline re-splits its layers
    over stages of TP 4, 2 and 1 (Hetu v2 Table 7's C2, scaled to 16 GPUs)."""
    cluster = get_cluster("h20x16")
    c1 = place(parse_strategy("2*tp4pp2"), cluster, model)
    n = model.layers
    a, b = n * 7 // 16, n * 13 // 16
    c2 = ((Stage((0, 1, 2, 3), 4, 1, 0, n // 2, embed=True), Stage((4, 5, 6, 7), 4, 1, n // 2, n, head=True)),
          (Stage((8, 9, 10, 11), 4, 1, 0, a, embed=True), Stage((12, 13), 2, 1, a, b), Stage((14,), 1, 1, b, n,
                                                                                             head=True)))
    return cluster, c1, c2


def timed(topo, call, repeats):
    """Median wall time of planning with a fresh planner (cold) and of repeating the call (cached), in ms."""
    cold, warm = [], []
    for _ in range(repeats):
        planner = SwitchPlanner(topo, itemsize=2)
        t = time.perf_counter()
        plan = call(planner)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        call(planner)
        warm.append(time.perf_counter() - t)
    return plan, statistics.median(cold) * 1e3, statistics.median(warm) * 1e3


def row(name, plan, cold=None, warm=None):
    intra = sum(s.send_intra for s in plan.stats.values())
    t = f"{cold:9.1f} {warm:9.4f}" if cold is not None else f"{'':>9} {'':>9}"
    return (f"{name:<28} {plan.max_send() / MB:9.1f} {plan.max_recv() / MB:9.1f} {plan.total_bytes() / MB:10.1f} "
            f"{intra / MB:10.1f} {plan.inter_node_bytes() / MB:10.1f} {plan.num_messages:6d} {t}")


HEADER = (f"{'method':<28} {'maxsend':>9} {'maxrecv':>9} {'total':>10} {'intra':>10} {'inter':>10} {'msgs':>6} "
          f"{'plan ms':>9} {'cached ms':>9}")


def senders(plan):
    parts = []
    for r in sorted(plan.stats):
        s = plan.stats[r]
        if s.send:
            parts.append(f"R{r}: {s.send_intra / MB:.0f}/{s.send_inter / MB:.0f}")
    return " ".join(parts)


def switch_table(title, topo, model, src, dst, repeats) -> None:
    print(f"\n# {title}")
    print(HEADER)
    rows = [("unfused BSR w/o heuristics", dict(fused=False, heuristics=False)),
            ("unfused BSR", dict(fused=False, heuristics=True)),
            ("fused BSR w/o heuristics", dict(fused=True, heuristics=False)),
            ("fused BSR (Hetu v2 §6.2)", dict(fused=True, heuristics=True))]
    plans = {}
    for name, kw in rows:
        plan, cold, warm = timed(topo, lambda p, kw=kw: p.switch(model, src, dst, **kw), repeats)
        plans[name] = plan
        print(row(name, plan, cold, warm))
    print("# per-sender volume (MB NVLink/IB), cf. Hetu v2 Table 2")
    for name in plans:
        print(f"#   {name:<27} {senders(plans[name])}")


def _execute_worker(rank, world, model_name, src_text, dst_text, repeats):
    """Execute the switch with each planning method on gloo ranks; check the result exactly; median wall time."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from tidal.runtime.reshard.execute import GroupCache
    from tidal.runtime.reshard.switch import run
    from tidal.runtime.reshard.testing import check, shard

    model = get_model(model_name)
    cluster = get_cluster(f"cpux{world}")
    src = place(parse_strategy(src_text), cluster, model)
    dst = place(parse_strategy(dst_text), cluster, model)
    planner = SwitchPlanner(Topology.uniform(world, world // 2), itemsize=4)
    groups = GroupCache()
    rng = np.random.default_rng(0)
    out = {}
    for name, kw in (("unfused w/o heuristics", dict(fused=False, heuristics=False)),
                     ("unfused", dict(fused=False)), ("fused", dict(fused=True))):
        plan = planner.switch(model, src, dst, **kw)
        values = [rng.integers(-9, 10, size=mv.shape).astype(np.float32) for mv in plan.moves]
        xs = []
        for mv, v in zip(plan.moves, values):
            sh = shard(mv.src, v, rng)
            xs.append(torch.from_numpy(sh[rank]) if rank in sh else None)
        times = []
        run(plan, xs, groups)  # warm-up: gloo connects peer pairs lazily on first use
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            res = run(plan, xs, groups)
            dist.barrier()
            times.append(time.perf_counter() - t)
        got = [None if r is None else r.numpy() for r in res]
        gathered = [None] * world
        dist.all_gather_object(gathered, got)
        bad = sum(check(mv.dst, v, {r: g[t] for r, g in enumerate(gathered) if g[t] is not None}) is not None
                  for t, (mv, v) in enumerate(zip(plan.moves, values)))
        out[name] = (statistics.median(times) * 1e3, plan.num_messages, bad)
    return out


def execute_table(world: int, repeats: int) -> None:
    from tidal.runtime.launch import run_distributed

    src, dst, name = "2*tp2pp2", "tp4+2*tp2", "small"
    res = run_distributed(_execute_worker, world, name, src, dst, repeats, timeout_s=300)[0]
    print(f"\n# Measured on {world} gloo ranks (CPU, fp32): switch {src} -> {dst} of model '{name}', "
          f"median of {repeats} after a warm-up run")
    print(f"{'method':<28} {'wall ms':>9} {'msgs':>6} {'wrong tensors':>14}")
    for k, (ms, msgs, bad) in res.items():
        print(f"{k:<28} {ms:9.1f} {msgs:6d} {bad:14d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--execute", action="store_true", help="also execute a switch on 8 gloo ranks and time it")
    args = ap.parse_args()
    model = get_model(args.model)
    cluster, c1, c2 = c1_c2(model)
    topo = Topology.from_cluster(cluster)
    w = len(model_param_shapes(model))
    print(f"# Strategy switches ({model.name}, {w} tensors, bf16) on {cluster.name}: 2 nodes x 8, "
          f"NVLink {cluster.groups[0].device.intra_bw / 1e9:.0f} GB/s, IB {cluster.groups[0].device.inter_bw / 1e9:.0f}"
          f" GB/s")
    print("# volumes in MB; maxsend/maxrecv per rank; intra/inter = NVLink/IB bytes; msgs = point-to-point messages")
    switch_table("C1 -> C2 (Hetu v2 §8 Table 2 shape): C1 = [R0-3|R4-7], [R8-11|R12-15] (tp4, 2 stages); "
                 "C2 = [R0-3|R4-7], [R8-11|R12-13|R14] (stage TP 4/2/1)", topo, model, c1, c2, args.repeats)
    four = place(parse_strategy("4*tp2pp2"), cluster, model)
    switch_table("4*tp2pp2 -> 2*tp4pp2 (two equal-bandwidth replicas per node: heuristic III balances the senders)",
                 topo, model, four, c1, args.repeats)

    world = 8
    cl8 = get_cluster("a800x8")
    topo8 = Topology.from_cluster(cl8)
    for text in ("tp2pp2+2*tp1pp2", "tp4+2*tp2", "8*tp1"):
        st = place(parse_strategy(text), cl8, model)
        total = 2 * sum(math.prod(v) for v in model_param_shapes(model).values())
        print(f"\n# Hydraulis LNK on {world} ranks: fully sharded over {world} <-> {text} ({model.name}, bf16, "
              f"W = {total / MB:.0f} MB of parameters)")
        print(HEADER)
        for kind in ("pull", "push"):
            plan, cold, warm = timed(topo8, lambda p, k=kind, s=st: getattr(p, k)(model, s, range(world)), args.repeats)
            print(row(kind, plan, cold, warm))
        planner = SwitchPlanner(topo8, itemsize=2)
        worst = 0.0
        shapes = model_param_shapes(model)
        for name in ["tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.attention.wk.weight",
                     "layers.0.attention.wo.weight", "layers.0.feed_forward.w2.weight",
                     "layers.0.attention_norm.weight",
                     f"layers.{model.layers - 1}.feed_forward.w3.weight", "norm.weight", "output.weight"]:
            size = 2 * math.prod(shapes[name])
            for moves in (pull_moves(model, st, range(world), [name]), push_moves(model, st, range(world), [name])):
                one = planner.plan(moves)
                worst = max(worst, one.max_send() / size, one.max_recv() / size)
        print(f"# worst per-rank send or recv / parameter size, per parameter: {worst:.3f} (App. B.1 bound: 1.0)")
    if args.execute:
        execute_table(8, args.repeats)


if __name__ == "__main__":
    main()
