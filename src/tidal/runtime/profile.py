"""Measure forward + backward time of packed micro-batches in the profile format of docs/costmodel.md, so a fitted
cost model reflects this device: `profile_tp1` (one process, tp1) and `profile_scheme` (the real runtime, any
<TP, PP, CP>, spawned ranks). Busy time is the thread's CPU time (time.thread_time), which stays meaningful when other
processes share the cores; on CUDA it is wall time after a device synchronise. `profile_model` measures several
schemes and fits latency and MaxLen (`tidal profile`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.scheme import parse_scheme
from tidal.costmodel.fitted import PROFILE_FORMAT, ProfileRow
from tidal.models.llama import Llama, VarlenBatch, loss_sum


def compositions(totals: Sequence[int], seed: int = 0, mixes: Sequence[int] = (8,),
                 max_doc: int | None = None) -> list[list[int]]:
    """Per total length: one document, 4 equal, 16 equal, and a long-tailed (lognormal) mix of each size in `mixes`,
    so the fit separates the quadratic (sum l^2) and linear (sum l) work. With `max_doc`, longer documents are split
    into pieces of at most `max_doc` tokens (as training splits documents above its context length)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in totals:
        mbs = [[t], [t // 4] * 4, [max(1, t // 16)] * 16]
        for k in mixes:
            raw = rng.lognormal(0.0, 1.2, size=k)
            lens = np.maximum(1, np.floor(raw / raw.sum() * t)).astype(int)
            lens[0] += t - int(lens.sum())
            mbs.append(sorted((int(x) for x in lens if x > 0), reverse=True))
        if max_doc is not None:
            mbs = [sorted((p for x in mb for p in [max_doc] * (x // max_doc) + [x % max_doc] if p > 0),
                          reverse=True) for mb in mbs]
        out += mbs
    return out


def corpus_compositions(lengths: Sequence[int], totals: Sequence[int], per_total: int = 4, seed: int = 0,
                        max_doc: int | None = None) -> list[list[int]]:
    """Micro-batches made of the corpus's own documents, so a fit sees the documents-per-token mix training will:
    per total length, one single document (the quadratic term's leverage) and `per_total` micro-batches filled with
    documents drawn at random from `lengths` (split above `max_doc`, as training splits them); the last document drawn
    is cut to fill the total exactly."""
    docs = np.asarray([int(x) for x in lengths if int(x) > 0], dtype=np.int64)
    if docs.size == 0:
        raise TidalError("the corpus has no non-empty document to profile with")
    if max_doc is not None:
        docs = np.minimum(docs, max_doc)
    rng = np.random.default_rng(seed)
    out = []
    for t in totals:
        cut = t if max_doc is None else max_doc
        out.append([cut] * (t // cut) + ([t % cut] if t % cut else []))
        for _ in range(per_total):
            mb, room = [], t
            while room > 0:
                d = int(min(docs[rng.integers(docs.size)], room))
                mb.append(d)
                room -= d
            out.append(sorted(mb, reverse=True))
    return out


def profile_tp1(spec: ModelSpec, micro_batches: Sequence[Sequence[int]], *, backend: str = "sdpa",
                repeats: int = 1, seed: int = 0) -> list[tuple[tuple[int, ...], float]]:
    """(lengths, seconds) per micro-batch: the median over `repeats` of one forward + backward's CPU time."""
    torch.manual_seed(seed)
    model = Llama(spec, backend)
    g = torch.Generator().manual_seed(seed)
    out = []
    warm = torch.randint(0, spec.vocab, (65,), generator=g)
    loss_sum(model(warm[:-1], VarlenBatch.from_lengths([64])), warm[1:]).backward()
    for lens in micro_batches:
        toks = torch.randint(0, spec.vocab, (sum(lens) + 1,), generator=g)
        batch = VarlenBatch.from_lengths(lens)
        times = []
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            t0 = time.thread_time()
            loss_sum(model(toks[:-1], batch), toks[1:]).backward()
            times.append(time.thread_time() - t0)
        out.append((tuple(int(x) for x in lens), statistics.median(times)))
    return out


def write_profile(path: str | Path, spec: ModelSpec, device: str, scheme: str,
                  rows: Sequence[tuple[Sequence[int], float]]) -> None:
    write_rows(path, spec, device, [ProfileRow(parse_scheme(scheme), tuple(lens), sec) for lens, sec in rows])


def write_rows(path: str | Path, spec: ModelSpec, device: str, rows: Sequence[ProfileRow]) -> None:
    """The profile CSV (docs/costmodel.md) of rows of any schemes."""
    lines = [f"# {PROFILE_FORMAT} model={spec.name} device={device}", "scheme,lengths,seconds"]
    lines += [f"{r.scheme},{' '.join(map(str, r.lengths))},{r.seconds:.6g}" for r in rows]
    Path(path).write_text("\n".join(lines) + "\n")
