"""Worker bodies for the communication-order tests: each runs real code inside a `commcheck.Recorder` on gloo ranks
and returns the records, which the parent replays under NCCL's rules."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tidal.core import ParallelScheme
from tidal.runtime.commcheck import Recorder
from tidal.runtime.pipeline import GroupCache
from tidal.runtime.pp import schedule_1f1b
from tidal.runtime.train import train_worker

from _parallel_cases import PP_LENGTHS, TINY, run_case  # isort: skip

# eight micro-batches (two per stage at pp4), lengths from 1 to 90 tokens: messages of 128 B to 11.5 KB in fp32
PP_MBS8 = ((0,), (1,), (2, 3), (4, 5), (6,), (7, 8), (9,), (6, 7))
PIPELINES = (
    ("1f1b pp2", ParallelScheme(pp=2), (0, 1), "1f1b", {}),
    ("1f1b pp4", ParallelScheme(pp=4, layer_split=(2, 1, 1, 2)), (0, 1, 2, 3), "1f1b", {}),
    ("gpipe pp4", ParallelScheme(pp=4, layer_split=(2, 1, 1, 2)), (3, 2, 1, 0), "gpipe", {}),
    ("1f1b tp2pp2 sp", ParallelScheme(tp=2, pp=2), (0, 1, 2, 3), "1f1b", {"sequence_parallel": True}),
    ("1f1b cp2pp2", ParallelScheme(cp=2, pp=2), (0, 1, 2, 3), "1f1b", {}),
    # full recomputation repeats TP/SP and CP collectives inside the backward (decision 90)
    ("1f1b tp2pp2 sp full", ParallelScheme(tp=2, pp=2), (0, 1, 2, 3), "1f1b",
     {"sequence_parallel": True, "recompute": "full"}),
    ("1f1b cp2pp2 full", ParallelScheme(cp=2, pp=2), (0, 1, 2, 3), "1f1b", {"recompute": "full", "offload": True}),
)


def pipelines_worker(rank: int, world: int) -> dict:
    """Records of run_pipeline for each PIPELINES case (group creation and warm-up included; ranks outside the
    pipeline only create groups), with the largest relative gradient error against one process."""
    torch.set_num_threads(1)
    out = {}
    for name, scheme, devices, schedule, opts in PIPELINES:
        modes = ("per-doc",) * len(PP_MBS8) if scheme.cp > 1 else ()
        with Recorder() as rec:
            r = run_case(rank, [(scheme, devices, TINY)], PP_LENGTHS, PP_MBS8, modes, schedule=schedule,
                         groups=GroupCache(), tp_options=opts)
        out[name] = {"ops": rec.ops, "err": None if r is None else max(r["errs"].values())}
    for pp in (2, 4):
        with Recorder() as rec:
            dist.barrier()  # every rank has a record that starts on the same collective
            if rank < pp:
                old_1f1b(rank, pp, 4)
        out[f"old pp{pp}"] = {"ops": rec.ops}
    return out


def old_1f1b(stage: int, pp: int, num_micro: int, hidden: int = 16) -> None:
    """The communication of pp.execute before issue 23, call for call: after a forward (backward) a non-blocking
    send of an int64 shape header and then of the tensor to the next (previous) stage; before a forward (backward)
    a blocking receive of the header, its `.tolist()`, and a blocking receive of the tensor; all on the default
    group; completed sends polled after each action and waited at the end. Compute is a stand-in (x * 2)."""
    first, last = stage == 0, stage == pp - 1
    pending, keep = [], []

    def send(t: torch.Tensor, dst: int) -> None:
        header = torch.zeros(8, dtype=torch.int64)
        header[0] = t.dim()
        header[1:1 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        pending.extend([dist.isend(header, dst), dist.isend(t, dst)])
        keep.append((header, t))

    def recv(src: int) -> torch.Tensor:
        header = torch.empty(8, dtype=torch.int64)
        dist.recv(header, src)
        h = header.tolist()
        out = torch.empty(tuple(h[1:1 + h[0]]))
        dist.recv(out, src)
        return out

    for kind, i in schedule_1f1b(num_micro, pp, stage):
        if kind == "F":
            x = torch.full((3 + i, hidden), float(i)) if first else recv(stage - 1)
            if not last:
                send(x * 2, stage + 1)
        else:
            g = torch.full((3 + i, hidden), float(i)) if last else recv(stage + 1)
            if not first:
                send(g * 2, stage - 1)
        pending = [w for w in pending if not w.is_completed()]
    for w in pending:
        w.wait()


def training_worker(rank: int, world: int, jobs: list) -> list:
    """Each job trained by `tidal train`'s worker (executor construction, warm-up, steps) inside a recorder."""
    out = []
    for job in jobs:
        with Recorder() as rec:
            train_worker(rank, world, job)
        out.append(rec.ops)
    return out
