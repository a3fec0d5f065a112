"""Resident bytes per rank: the executor's tensor storages measured on gloo ranks (CPU) against the memory model
(costmodel/memory.py `resident_bytes`), for several strategies and candidate-set sizes.

Measured: every live tensor storage of the rank process (gc walk, deduplicated by storage; those that existed before
the executor was built are subtracted) at the step's three peaks: "pull" (every parameter group's pull posted),
"backward" (after the last micro-batch's backward: parameters + gradient buffer) and "push" (after each parameter
group's push; the worst group). Activations are left out on both sides (autograd-saved bytes are measured apart by
pp.ExecStats.peak_saved_bytes; no probe runs while a graph is alive). The push's within-call buffers (packing inside
reshard.execute, one group at a time) are charged by the model but not seen by the probes, which run between groups.

    python benchmarks/resident_memory.py [--model small] [--world 4] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import gc
import sys
import warnings

STRATEGIES = ("4*tp1", "2*tp2", "tp4", "tp2pp2", "pp4", "tp1cp2+2*tp1")
SIZES = (1, 2, 4)
# torch.distributed's Python entry points: while one is called, the buffers it sends and receives are alive
COMM_CALLS = frozenset({"batch_isend_irecv", "all_reduce", "reduce_scatter", "all_gather", "reduce_scatter_tensor"})


def live_bytes() -> dict[int, int]:
    """data_ptr -> bytes of every tensor storage reachable from Python objects."""
    import torch

    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on some lazily imported modules' objects warns
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            if isinstance(o, torch.Tensor) and o.device.type != "meta":
                st = o.untyped_storage()
                if st.data_ptr():
                    seen[st.data_ptr()] = st.nbytes()
    return seen


def measure_worker(rank: int, world: int, model_name: str, cases, compute: str, master: str) -> list:
    """For each (strategies, candidate 0 runs): build an executor over all of them, run one step of candidate 0, and
    return per phase the measured bytes on this rank and the model's bytes for this rank's stage."""
    import torch

    from tidal.core import get_cluster, get_model, parse_strategy, place
    from tidal.core.plan import PipelinePlan, StepPlan
    from tidal.costmodel.memory import MemoryConfig, resident_bytes
    from tidal.runtime.executor import DTYPES, ExecConfig, Executor
    from tidal.runtime.groups import GroupCache
    from tidal.runtime.optim import OptimConfig

    torch.set_num_threads(1)
    spec, cluster = get_model(model_name), get_cluster(f"cpux{world}")
    cb, mb = (torch.finfo(DTYPES[x]).bits // 8 for x in (compute, master))
    mem = MemoryConfig(param_bytes_per_param=cb, grad_bytes_per_param=max(cb, 4), master_bytes_per_param=3 * mb,
                       shard_grad_bytes_per_param=mb)
    out = []
    for texts in cases:
        gc.collect()
        before = live_bytes()
        cands = [place(parse_strategy(t), cluster, spec) for t in texts]
        ex = Executor(spec, cluster, cands, ExecConfig(compute_dtype=compute, master_dtype=master,
                                                       attn_backend="sdpa"), OptimConfig(), GroupCache())
        peaks: dict[str, int] = {}

        def probe(phase: str) -> None:
            now = live_bytes()
            got = sum(b for p, b in now.items() if before.get(p) != b)
            peaks[phase] = max(peaks.get(phase, 0), got)
            if phase == "backward":  # from here on, also inside the push: whenever a communication call is made
                sys.setprofile(inside_push)

        def inside_push(frame, event, _arg) -> None:
            if event == "call" and frame.f_code.co_name in COMM_CALLS:
                sys.setprofile(None)
                probe("push")
                sys.setprofile(inside_push)

        strategy, length = cands[0], 64
        pipes = tuple(PipelinePlan(p.scheme.tp, p.scheme.pp, p.scheme.cp, p.devices, length, ((j,),), 0.0,
                                   ("per-doc",) if p.scheme.cp > 1 else (), p.scheme.layer_split)
                      for j, p in enumerate(strategy.pipelines))
        plan = StepPlan(tuple(range(len(pipes))), (length,) * len(pipes), 0, pipes, (), 0.0, 0.0)
        toks = torch.randint(0, spec.vocab, (length + 1,), generator=torch.Generator().manual_seed(0))
        ex.train_step(plan, lambda _j: toks)  # first step: lazily made state (Adam, gloo) settles
        ex.probe = probe
        try:
            ex.train_step(plan, lambda _j: toks)
        finally:
            sys.setprofile(None)
        ex.probe = None
        pipe = next(p for p in strategy.pipelines if rank in p.devices)
        stage = pipe.devices.index(rank) // (pipe.scheme.tp * pipe.scheme.cp)
        model = resident_bytes(spec, pipe.scheme, world, stage, mem)
        out.append({"rank": rank, "scheme": str(pipe.scheme), "stage": stage, "measured": peaks, "model": model})
        del ex
    return out


def run(model: str, world: int, strategies, sizes, compute: str = "float32", master: str = "float32") -> list:
    """Rows (strategy, candidate-set size, per-rank results)."""
    from tidal.runtime.launch import run_distributed

    cases, keys = [], []
    for i, s in enumerate(strategies):
        for n in sizes:
            others = [strategies[(i + j) % len(strategies)] for j in range(1, n)]
            cases.append([s, *others])
            keys.append((s, n))
    res = run_distributed(measure_worker, world, model, cases, compute, master, timeout_s=1800)
    return [(s, n, [res[r][c] for r in range(world)]) for c, (s, n) in enumerate(keys)]


def worst(ranks) -> tuple[float, float, float, str]:
    """(measured peak, model peak, worst |measured/model - 1| over ranks and phases, where) for one case."""
    err, at, mp, md = 0.0, "", 0.0, 0.0
    for r in ranks:
        mp, md = max(mp, max(r["measured"].values())), max(md, max(r["model"].values()))
        for ph, v in r["measured"].items():
            e = abs(v / r["model"][ph] - 1.0)
            if e >= err:
                err, at = e, f"rank {r['rank']} {ph}"
    return mp, md, err, at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype (master fp32)")
    args = ap.parse_args()
    rows = run(args.model, args.world, STRATEGIES, SIZES, compute=args.dtype)
    print(f"# resident bytes per rank, model {args.model}, {args.world} gloo ranks, compute {args.dtype}, master fp32; "
          "MB = 1e6 B; peak = max over ranks and the pull/backward/push phases; err = worst |measured/model - 1| "
          "over ranks and phases")
    print(f"{'strategy':<14} {'cands':>5} {'measured MB':>12} {'model MB':>9} {'worst err':>9}  where")
    for s, n, ranks in rows:
        mp, md, err, at = worst(ranks)
        print(f"{s:<14} {n:5d} {mp / 1e6:12.2f} {md / 1e6:9.2f} {100 * err:8.1f}%  {at}")


if __name__ == "__main__":
    main()
