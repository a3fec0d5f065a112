"""Pull/push planning at scale (issue 23, decision 74): one rank plans its own LNK messages - the pull and the push of
every parameter group, what the executor plans and posts - for worlds of 64, 256 and 1024 ranks, llama2-13b and
llama2-70b, 8 heterogeneous candidates each. Prints one line per world size; asserts nothing.

    OMP_NUM_THREADS=1 python benchmarks/pullpush_scale.py [--worlds 64 256 1024] [--old-cap 120]

Per candidate the planned ranks are the first device of every distinct pipeline scheme (a tp1 rank, which holds every
layer with unsplit boxes, is the most work); `plan` is the slowest of them (CPU and wall seconds, planning every
group's pull and push with a fresh planner), `peak` the tracemalloc peak of planning the most expensive of them again
(Python allocations of the planner and its plans; a second pass because tracing slows planning). `scan` is the
bookkeeping `start` does before posting operations as the executor calls it, over every parameter group's push and
pull: this rank's boxes and shapes (`CommPlan.rank_view`; the executor checks its inputs' shapes once per candidate,
decision 75) (CPU time, least of 5); `check` is the vectorised input check `execute` / `start` run per step for
callers that did not (`check_inputs`: one list comparison of shapes, one pass over dtypes); `sel` walks this rank's
messages, reductions and copies (each becomes an operation: O(own messages), counted in `ops`). `old` is the global
planner (`SwitchPlanner.pull/push` plus the per-group pulls, what every rank ran before) for one candidate at 64 ranks,
capped, with its per-step scan (every annotation entry and every message of the world, as `_Local` and `_p2p` did).
llama2-70b is not a preset: its published shape (80 layers, 8192 hidden, 64 heads, 8 KV heads, FFN 28672) is built
here.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import resource
import statistics
import time
import tracemalloc

import torch

from tidal.core import get_cluster, get_model, parse_strategy, place
from tidal.core.model import ModelSpec, param_table
from tidal.runtime.reshard.execute import check_inputs
from tidal.runtime.reshard.local import Links, LocalPlanner

LLAMA2_70B = ModelSpec("llama2-70b", 80, 8192, 64, 8, 28672, 32000)


def candidates(world: int, layers: int) -> list[str]:
    """8 heterogeneous strategies covering `world` ranks (u = world / 64)."""
    u = world // 64
    a = layers * 9 // 20
    return [f"{8 * u}*tp8", f"{4 * u}*tp8+{4 * u}*tp4pp2", f"{4 * u}*tp4pp2+{8 * u}*tp2cp2",
            f"{2 * u}*tp8+{2 * u}*tp4pp2+{4 * u}*tp2cp2+{16 * u}*tp1",
            f"{2 * u}*tp8pp2+{4 * u}*tp4pp2[{a},{layers - a}]", f"{2 * u}*tp4pp4+{4 * u}*tp2pp4",
            f"{4 * u}*tp8+{8 * u}*tp2cp2", f"{2 * u}*tp8+{3 * u}*tp4pp2+{4 * u}*tp2cp2+{8 * u}*tp1"]


def layer_groups(table) -> list[list[int]]:
    """The executor's pull groups: the embedding, each layer, the final norm and head (exec_util._param_groups)."""
    groups: dict[str, list[int]] = {}
    for i, info in enumerate(table):
        groups.setdefault({"embed": "e", "head": "h"}.get(str(info.owner), str(info.owner)), []).append(i)
    return list(groups.values())


def plan_rank(model, strategy, world, rank, links, table, groups):
    planner = LocalPlanner(model, strategy, world, rank, links, table)
    return ([planner.pull(g, itemsize=2) for g in groups],
            [planner.push(g, itemsize=4) for g in reversed(groups)])


def scan(plans, rank, inputs) -> tuple[float, float, float, int]:
    """(bookkeeping seconds, check seconds, selection seconds, own operations) of one step over `plans`.
    Bookkeeping is what `start` does per plan before posting, as the executor calls it (`checked=True`: it validated
    its inputs' shapes once per candidate, decision 75): this rank's boxes and shapes (`rank_view`, cached on the
    plan). Check is `check_inputs`, which `execute` / `start` run per step for a caller that has not (`inputs`: meta
    tensors of the right shapes). Selection walks this rank's own parts (each becomes an operation)."""
    t0 = time.process_time()
    for plan in plans:
        view = plan.rank_view(rank)
        if view is None:
            raise AssertionError("no view")
    t1 = time.process_time()
    for plan, xs in zip(plans, inputs):
        check_inputs(plan.rank_view(rank), xs, torch.float32, rank)
    t2 = time.process_time()
    ops = 0
    for plan in plans:
        ops += sum(1 for m in itertools.chain(plan.reduce_msgs, plan.messages) if rank in (m.sender, m.receiver))
        ops += sum(1 for red in plan.reductions for it in red.items if it[1] == rank)
        ops += sum(1 for r, _ in plan.copies if r == rank)
    return t1 - t0, t2 - t1, time.process_time() - t2, ops


def meta_inputs(plan, rank) -> list:
    view = plan.rank_view(rank)
    return [torch.empty(view.src_shape[t], device="meta") if t in view.src_shape else None
            for t in range(len(plan.moves))]


def measure(model, world: int) -> dict:
    cluster = get_cluster(f"a800x{world}")
    links = Links.from_cluster(cluster, world)
    table = param_table(model)
    groups = layer_groups(table)
    rows = []
    for text in candidates(world, model.layers):
        strategy = place(parse_strategy(text), cluster, model)
        firsts = {}
        for p in strategy.pipelines:
            firsts.setdefault(p.scheme, p.devices[0])
        worst = [0.0, 0.0, 0.0, 0.0, 0, 0.0]
        slowest, most = None, -1.0
        for rank in firsts.values():
            w0, c0 = time.perf_counter(), time.process_time()
            gp, gq = plan_rank(model, strategy, world, rank, links, table, groups)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            inputs = [meta_inputs(p, rank) for p in (*gq, *gp)]
            runs = [scan([*gq, *gp], rank, inputs) for _ in range(5)]  # the machine is shared: the least of 5
            s, chk, sel, ops = (min(r[0] for r in runs), min(r[1] for r in runs), min(r[2] for r in runs),
                                runs[0][3])
            worst = [max(a, b) for a, b in zip(worst, (wall, cpu, s, sel, ops, chk))]
            if cpu > most:
                slowest, most = rank, cpu
            del gp, gq, inputs
        tracemalloc.start()  # the most expensive rank again, traced
        plan_rank(model, strategy, world, slowest, links, table, groups)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows.append((*worst, peak))
    return {"wall": [r[0] for r in rows], "cpu": [r[1] for r in rows], "scan": [r[2] for r in rows],
            "sel": [r[3] for r in rows], "ops": [r[4] for r in rows], "check": [r[5] for r in rows],
            "peak": [r[6] for r in rows]}


def _old_worker(model_name, world, text, out):
    from tidal.runtime.reshard import Topology
    from tidal.runtime.reshard.switch import SwitchPlanner, pull_moves

    model = get_model(model_name)
    cluster = get_cluster(f"a800x{world}")
    strategy = place(parse_strategy(text), cluster, model)
    table = param_table(model)
    w0, c0 = time.perf_counter(), time.process_time()
    topo = Topology.from_cluster(cluster, world)
    pp, qp = SwitchPlanner(topo, itemsize=2), SwitchPlanner(topo, itemsize=4)
    pp.pull(model, strategy, range(world))
    push = qp.push(model, strategy, range(world))
    gp = [pp.plan(pull_moves(model, strategy, range(world), [table[i].name for i in g]), bsr_only=True)
          for g in layer_groups(table)]
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rank = strategy.pipelines[-1].devices[0]
    t0 = time.perf_counter()
    for plan in [push, *gp]:  # the old per-step walk: every entry of every annotation, every message of the world
        for mv in plan.moves:
            for e in mv.src.entries(mv.shape):
                if e.device == rank:
                    pass
            for e in mv.dst.entries(mv.shape):
                if e.device == rank:
                    pass
        sum(1 for m in itertools.chain(plan.reduce_msgs, plan.messages) if rank in (m.sender, m.receiver))
    out.put((wall, cpu, time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def old_planner(world: int, cap: float) -> str:
    text = candidates(world, 40)[3]
    q: mp.Queue = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_old_worker, args=("llama2-13b", world, text, q))
    p.start()
    p.join(cap)
    if p.is_alive():
        p.kill()
        p.join()
        return f"old global planner (llama2-13b, {text}): > {cap:.0f} s (capped)"
    wall, cpu, sc, rss = q.get()
    return (f"old global planner (llama2-13b, {text}): plan {wall:.1f} s (cpu {cpu:.1f}), per-step scan "
            f"{sc * 1e3:.0f} ms, process max RSS {rss:.0f} MB")


def _size(box) -> int:
    n = 1
    for a, b in box:
        n *= max(0, b - a)
    return n


def _meet(a, b):
    return tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))


def minimum(model, strategy, world: int) -> dict[str, list[int]]:
    """Per rank, the elements the disaggregation cannot avoid moving, counted from the annotations alone. Pull: a
    holder receives every element of its shard it does not own, and an owner sends its rows to every other holder
    of them (each row has one owner). Push: an owner receives, for every addend (pipeline x CP rank x tied stage)
    of its rows, all of it except what it holds itself; a holder's sends are the same elements seen from the other
    end (total only: which of a norm's TP duplicates sends is a choice)."""
    from tidal.runtime.reshard.switch import pull_moves, push_moves

    out = {"pull_recv": [0] * world, "pull_send": [0] * world, "push_recv": [0] * world}
    for mv in pull_moves(model, strategy, range(world)):
        shape = mv.shape
        for e in mv.dst.entries(shape):
            for o in range(world):
                own = (_rows(shape[0], world, o),) + tuple((0, x) for x in shape[1:])
                k = _size(_meet(e.box, own))
                if k and o != e.device:
                    out["pull_recv"][e.device] += k
                    out["pull_send"][o] += k
    for mv in push_moves(model, strategy, range(world)):
        shape = mv.shape
        entries = mv.src.entries(shape)
        addends = len({e.addend for e in entries})
        held = {e.device: e.box for e in entries}
        for o in range(world):
            own = (_rows(shape[0], world, o),) + tuple((0, x) for x in shape[1:])
            out["push_recv"][o] += addends * _size(own) - (_size(_meet(held[o], own)) if o in held else 0)
    return out


def _rows(n: int, world: int, r: int) -> tuple[int, int]:
    q, m = divmod(n, world)
    lo = r * q + min(r, m)
    return lo, lo + q + (1 if r < m else 0)


def bytes_table(model, world: int, texts) -> None:
    """Every rank's local pull and push bytes against the minimum (ratios; 1.000 = at the minimum)."""
    cluster = get_cluster(f"a800x{world}")
    links = Links.from_cluster(cluster, world)
    table = param_table(model)
    for text in texts:
        strategy = place(parse_strategy(text), cluster, model)
        mins = minimum(model, strategy, world)
        pr, ps, qr, qs = [], [], [], []
        for r in range(world):
            planner = LocalPlanner(model, strategy, world, r, links, table)
            a, b = planner.pull(itemsize=1).stats[r], planner.push(itemsize=1).stats[r]
            pr.append(a.recv)
            ps.append(a.send)
            qr.append(b.recv)
            qs.append(b.send)

        def rng(got, want):
            rs = [g / w for g, w in zip(got, want) if w] or [1.0]
            return f"{min(rs):.3f}-{max(rs):.3f}"

        pull = f"{sum(pr) / sum(mins['pull_recv']):.3f}"
        push = f"{sum(qs) / sum(mins['push_recv']):.3f}"
        print(f"bytes / minimum, {model.name} on {world} ranks, {text}: pull total {pull} (per rank recv "
              f"{rng(pr, mins['pull_recv'])}, send {rng(ps, mins['pull_send'])}); push total {push} (per rank recv "
              f"{rng(qr, mins['push_recv'])})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--models", nargs="+", default=["llama2-13b", "llama2-70b"])
    ap.add_argument("--old-cap", type=float, default=120.0, help="seconds allowed to the old planner at 64 ranks")
    ap.add_argument("--bytes", action="store_true", help="only the bytes-vs-minimum table (8 and 64 ranks)")
    args = ap.parse_args()
    if args.bytes:
        bytes_table(get_model("llama2-7b"), 8, ["tp2pp2+2*tp1pp2", "tp4+2*tp2", "8*tp1", "tp4pp2", "tp2cp2+2*tp2"])
        bytes_table(get_model("llama2-13b"), 64, candidates(64, 40)[1:5])
        return
    models = [LLAMA2_70B if m == "llama2-70b" else get_model(m) for m in args.models]
    print("# per candidate (8 per world and model), worst planned rank: plan = CPU s (wall s) of every parameter "
          "group's pull and push; peak = tracemalloc MB; scan / sel = per-step CPU ms (check: input checks, which the "
          "executor does once per candidate instead); ops = own operations per step")
    for world in args.worlds:
        parts = []
        for model in models:
            r = measure(model, world)
            parts.append(f"{model.name}: plan cpu max {max(r['cpu']):.2f} s median {statistics.median(r['cpu']):.2f} s "
                         f"(wall max {max(r['wall']):.2f} s), peak max {max(r['peak']) / 1e6:.0f} MB, scan max "
                         f"{max(r['scan']) * 1e3:.2f} ms (check {max(r['check']) * 1e3:.2f} ms), "
                         f"sel max {max(r['sel']) * 1e3:.1f} ms, ops max "
                         f"{max(r['ops'])}")
        print(f"world {world:5d} | " + " | ".join(parts), flush=True)
    if args.old_cap > 0:
        print(old_planner(64, args.old_cap))
    print(f"# process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (getrusage: "
          f"interpreter, imports and every plan above)")


if __name__ == "__main__":
    main()
