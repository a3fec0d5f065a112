"""Micro-batch-level local search across pipelines (decision 60): the last step of the two-stage assignment.

The dispatch balances an objective that assumes a pipeline's work splits evenly over its micro-batches; packing then
finds how unevenly a few long documents really split. A pipeline's time is (PP - 1 + V) x its slowest micro-batch (PP =
1: their sum, decision 94), so
on a pipeline holding, say, documents of 9,325, 6,867 and 6,670 tokens in two micro-batches, no split is even, and
neither stage can see that another pipeline's micro-batch had room for one of them.

`polish` works on the packed plan itself, with the real objective: each round takes the slowest micro-batch of the
slowest pipeline and evaluates (kernels_polish.py: every round in one compiled call) moving each of its documents into
any micro-batch of another pipeline that has token room, and swapping it with any document of another pipeline. Each
candidate's value is the exact new time of both pipelines (the micro-batch times are sums of per-document work plus c,
so no re-packing is needed); the best move is taken if it lowers that pair's maximum by more than `min_gain`
(relative), so the search terminates. Pipelines keep their micro-batch count unless a move empties one. Plans are
rebuilt and re-timed with packing.finish (pipeline_time's float), and the result is kept only if faster, so it is never
worse and always valid.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan
from tidal.planner.bounds import PipeCost
from tidal.planner.config import DEFAULT
from tidal.planner.packing import finish
from tidal.planner.pipecost import pipe_coeffs


def polish(lengths: np.ndarray, pipes: tuple[PipeCost, ...], plans: tuple[PipelinePlan, ...], est: float, *,
           target: float = 0.0, rounds: int = 40, max_docs: int = 16, min_gain: float = 1e-4,
           light: int = DEFAULT.polish_light, loops: SimpleNamespace | None = None
           ) -> tuple[float, tuple[PipelinePlan, ...]]:
    """Improve a packed plan by moving and swapping documents between micro-batches of different pipelines
    (module doc). `plans` must hold every index of `lengths` once (TidalError otherwise). Stops after `rounds`, at
    `target` (a lower bound), or when no move gains. Returns (estimate, plans): the input unchanged unless the
    result is strictly faster. `loops`: kernels_polish.PLAIN or .COMPILED (the same source); None takes
    kernels_polish.loops()."""
    P = len(pipes)
    mb_docs = [mb for p in plans for mb in p.micro_batches]
    if P < 2 or not mb_docs:
        return est, plans
    if loops is None:
        from tidal.planner import kernels_polish

        loops = kernels_polish.loops()
    lf = np.asarray(lengths, dtype=np.float64)
    n_mb = len(mb_docs)
    sizes = [len(mb) for mb in mb_docs]
    mb_pipe, doc_mb = np.empty(n_mb, dtype=np.int64), np.empty(lf.size, dtype=np.int64)
    alive = np.ones(n_mb, dtype=bool)
    changed = np.zeros(P, dtype=bool)
    per_pipe = [np.asarray(x, dtype=np.float64) for x in pipe_coeffs(pipes)] + [
        np.array([p.pp - 1 for p in pipes], dtype=np.float64), np.array([p.max_len for p in pipes], dtype=np.float64)]
    missing = loops.polish_rounds(lf, *per_pipe, np.array([len(p.micro_batches) for p in plans], dtype=np.int64),
                                  np.fromiter(itertools.chain.from_iterable(mb_docs), dtype=np.int64,
                                              count=sum(sizes)), np.array(sizes, dtype=np.int64), mb_pipe, doc_mb,
                                  alive, changed, float(target), int(rounds), int(max_docs), float(min_gain),
                                  int(light))
    if missing >= 0:
        raise TidalError(f"polish: sequence {missing} is in no micro-batch of the plan")
    if not changed.any():
        return est, plans
    out, dp, li = list(plans), mb_pipe[doc_mb], np.asarray(lengths, dtype=np.int64)
    for j in np.flatnonzero(changed):  # its documents by micro-batch, laid out and timed as the packer's (finish)
        idx = np.flatnonzero(dp == j)
        res = finish(doc_mb[idx], li[idx], pipes[j].coeffs, pipes[j].pp, idx)
        p = plans[j]
        out[j] = PipelinePlan(p.tp, p.pp, p.cp, p.devices, p.max_len, res.micro_batches, res.est_time, (),
                              p.layer_split)
    new = max(p.est_time for p in out)
    return (new, tuple(out)) if new < est else (est, plans)
