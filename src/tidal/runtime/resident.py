"""Resident-memory accounting of the executor on one rank (benchmarks/resident_memory.py, tests/runtime): every live
tensor storage of the process, found by walking the garbage collector's objects and deduplicated by storage, at the
step's three peaks, against the memory model's `resident_bytes` for this rank's stage.

Phases: "pull" (the groups posted when the pull starts: its window, decision 75), "backward" (after the last
micro-batch's backward: parameters, the gradient buffers of groups whose push is not yet posted and the pushes in
flight) and "push" (after each parameter group's push completes, and whenever the push or the optimizer calls a
torch.distributed collective or batch_isend_irecv, so the packed buffers inside reshard.execute are counted; the
worst). Activations are left out on both sides: no probe runs while an autograd graph is alive (saved activations are
measured apart, pp.ExecStats.peak_saved_bytes). Storages that existed before the executor was built are not counted.
"""

from __future__ import annotations

import gc
import sys
import warnings

import torch

from tidal.core import get_cluster, get_model, parse_strategy, place
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.costmodel.memory import executor_memory, resident_bytes
from tidal.runtime.executor import ExecConfig, Executor
from tidal.runtime.groups import GroupCache
from tidal.runtime.optim import OptimConfig
from tidal.runtime.streams import PullStream


def live_bytes() -> dict[int, int]:
    """data_ptr -> bytes of every tensor storage reachable from Python objects."""
    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on some lazily imported modules' objects warns
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            if isinstance(o, torch.Tensor) and o.device.type != "meta":
                st = o.untyped_storage()
                if st.data_ptr():
                    seen[st.data_ptr()] = st.nbytes()
    return seen


# torch.distributed's Python entry points: while one is called, the buffers it sends and receives are alive
COMM_CALLS = frozenset({"batch_isend_irecv", "all_reduce", "reduce_scatter", "all_gather", "reduce_scatter_tensor"})


def measure_worker(rank: int, world: int, model_name: str, cases, compute: str, master: str) -> list:
    """For each list of strategies: build an executor over all of them, run one step of the first, and return per
    phase the measured bytes on this rank and the model's bytes for this rank's stage."""
    torch.set_num_threads(1)
    spec, cluster = get_model(model_name), get_cluster(f"cpux{world}")
    mem = executor_memory(compute, master)
    return [_measure(rank, world, spec, cluster, texts, compute, master, mem) for texts in cases]


def _measure(rank: int, world: int, spec, cluster, texts, compute: str, master: str, mem) -> dict:
    gc.collect()
    before = live_bytes()
    cands = [place(parse_strategy(t), cluster, spec) for t in texts]
    ex = Executor(spec, cluster, cands, ExecConfig(compute_dtype=compute, master_dtype=master, attn_backend="sdpa"),
                  OptimConfig(), GroupCache())
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
    pipe = next(p for p in strategy.pipelines if rank in p.devices)
    stage = pipe.devices.index(rank) // (pipe.scheme.tp * pipe.scheme.cp)
    # the pull's wire bytes on this rank (sent + received) as its plans give them: the closed form `resident_bytes`
    # uses without them cannot know which rows a placement keeps local
    # (of the groups posted when the pull starts: its window, decision 75)
    posted = ex.pull_groups[0][:PullStream.initial(ex.pull_receives[0], ex.cfg.pull_window)]
    wire = sum(st.send + st.recv for _, plan in posted if (st := plan.stats.get(rank)) is not None)
    model = resident_bytes(spec, pipe.scheme, world, stage, mem, pull_wire_bytes=wire)
    closed = resident_bytes(spec, pipe.scheme, world, stage, mem, replicas=sum(p.scheme.cp for p in strategy.pipelines))
    return {"rank": rank, "scheme": str(pipe.scheme), "stage": stage, "measured": peaks, "model": model,
            "closed_form": closed}




def worst(ranks, key: str = "model") -> tuple[float, float, float, str]:
    """(measured peak, model peak, worst |measured/model - 1| over ranks and phases, where) for one case; `key`:
    "model" (the pull's wire bytes from its plans) or "closed_form" (resident_bytes as the planner calls it)."""
    err, at, mp, md = 0.0, "", 0.0, 0.0
    for r in ranks:
        mp, md = max(mp, max(r["measured"].values())), max(md, max(r[key].values()))
        for ph, v in r["measured"].items():
            e = abs(v / r[key][ph] - 1.0)
            if e >= err:
                err, at = e, f"rank {r['rank']} {ph}"
    return mp, md, err, at
