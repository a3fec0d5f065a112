"""Exactly-once accounting over one epoch of a finite corpus: which positions of which documents were trained.

`EpochLedger(lengths)` takes each document's length (the corpus' `length_source()` data: tokens - 1, the positions
a document trains on). Each step, `record(trained, delayed)` gets the sequences `(doc_id, start, length)` that ran and
those carried to a later step (WLB outlier-delay queues); `record_planned(ps)` reads them from a
`tidal.planner.stepper.PlannedStep` (duck-typed: `docs`, `plan.pipelines[*].micro_batches`, `plan.deferred`; this
layer does not import the planner). A trained sequence must lie inside its document and must not overlap anything
already trained of it this epoch (TidalError naming the document otherwise); a document is complete when its trained
pieces tile [0, length) exactly. `counters()` holds, cumulatively:

    steps              steps recorded
    seqs_trained       sequences trained;    tokens_trained   their positions (sum of lengths)
    docs_trained       documents complete (every position trained exactly once)
    docs_split         complete documents trained as more than one sequence;  split_seqs  the sequences of those
    seqs_delayed       distinct sequences ever delayed;   tokens_delayed  their positions
    delay_steps        sequence-steps spent waiting (a sequence delayed over 3 steps counts 3)
    pending_delayed    sequences delayed now (in the queues, not yet trained)

`missing()` lists the documents not yet complete; `check_complete()` raises unless every document is complete and
nothing is pending, and then counters satisfy docs_trained == n_docs and tokens_trained == sum(lengths).
`state_dict()` / `load_state_dict()` are JSON-safe and resume exactly (checkpoint them with the sampler / planner).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from tidal.core.errors import TidalError

COUNTERS = ("steps", "seqs_trained", "tokens_trained", "docs_trained", "docs_split", "split_seqs", "seqs_delayed",
            "tokens_delayed", "delay_steps", "pending_delayed")


def _lengths_key(lengths: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(lengths, dtype="<i8").tobytes()).hexdigest()[:16]


class EpochLedger:
    """Per-epoch record of trained document positions; see the module docstring."""

    def __init__(self, lengths: np.ndarray | Iterable[int], spec: str = "corpus", *,
                 truncate_at: int | None = None) -> None:
        """`truncate_at`: the sampler's max_len when it runs with long_docs="truncate" (only the first max_len
        positions of a longer document are trained, so that is what completes it)."""
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1 or (self.lengths < 1).any():
            raise TidalError("ledger: lengths must be a 1-D array of positive integers")
        if truncate_at is not None:
            if truncate_at < 1:
                raise TidalError(f"ledger: truncate_at must be >= 1, got {truncate_at}")
            self.lengths = np.minimum(self.lengths, int(truncate_at))
        self.spec = spec
        self._done = np.zeros(len(self.lengths), dtype=bool)
        self._partial: dict[int, list[tuple[int, int]]] = {}  # doc -> trained (start, end) pieces, incomplete docs
        self._delayed: dict[tuple[int, int], int] = {}  # (doc, start) -> length, waiting in a queue
        self._c = dict.fromkeys(COUNTERS, 0)

    @property
    def n_docs(self) -> int:
        return len(self.lengths)

    def _train(self, doc: int, start: int, length: int) -> None:
        if not 0 <= doc < self.n_docs:
            raise TidalError(f"ledger {self.spec}: document {doc} not in 0..{self.n_docs - 1}")
        end, n = start + length, int(self.lengths[doc])
        if start < 0 or length < 1 or end > n:
            raise TidalError(f"ledger {self.spec}: sequence [{start}, {end}) outside document {doc} of {n} positions")
        if self._done[doc]:
            raise TidalError(f"ledger {self.spec}: document {doc} trained twice ([{start}, {end}) again this epoch)")
        pieces = self._partial.setdefault(doc, [])
        for a, b in pieces:
            if start < b and a < end:
                raise TidalError(f"ledger {self.spec}: document {doc} positions [{max(a, start)}, {min(b, end)}) "
                                 f"trained twice")
        pieces.append((start, end))
        c = self._c
        c["seqs_trained"] += 1
        c["tokens_trained"] += length
        if sum(b - a for a, b in pieces) == n:  # disjoint, inside [0, n) and summing to n: they tile it
            self._done[doc] = True
            c["docs_trained"] += 1
            if len(pieces) > 1:
                c["docs_split"] += 1
                c["split_seqs"] += len(pieces)
            del self._partial[doc]

    def record(self, trained: Iterable[tuple[int, int, int]], delayed: Iterable[tuple[int, int, int]] = ()) -> None:
        """One step: the sequences `(doc_id, start, length)` trained, and those delayed to a later step."""
        for d, s, n in trained:
            d, s, n = int(d), int(s), int(n)
            self._delayed.pop((d, s), None)
            self._train(d, s, n)
        c = self._c
        for d, s, n in delayed:
            key = (int(d), int(s))
            if key not in self._delayed:
                self._delayed[key] = int(n)
                c["seqs_delayed"] += 1
                c["tokens_delayed"] += int(n)
            c["delay_steps"] += 1
        c["pending_delayed"] = len(self._delayed)
        c["steps"] += 1

    def record_planned(self, ps: Any) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """Record a PlannedStep: trained = sequences in some micro-batch, delayed = `plan.deferred`. Returns both."""
        ran = sorted({i for p in ps.plan.pipelines for mb in p.micro_batches for i in mb})
        trained = [tuple(ps.docs[i]) for i in ran]
        delayed = [tuple(ps.docs[i]) for i in ps.plan.deferred]
        self.record(trained, delayed)
        return trained, delayed

    def counters(self) -> dict[str, int]:
        return dict(self._c)

    def missing(self) -> list[int]:
        """Documents not (completely) trained yet."""
        return np.flatnonzero(~self._done).tolist()

    @property
    def complete(self) -> bool:
        return bool(self._done.all()) and not self._delayed

    def check_complete(self) -> dict[str, int]:
        """The counters, after checking every document was trained exactly once and nothing is still delayed."""
        miss = self.missing()
        if miss or self._delayed:
            raise TidalError(f"ledger {self.spec}: epoch incomplete: {len(miss)} of {self.n_docs} documents not fully "
                             f"trained (first {miss[:5]}), {len(self._delayed)} sequences still delayed")
        c = self._c
        assert c["docs_trained"] == self.n_docs and c["tokens_trained"] == int(self.lengths.sum())
        return dict(c)

    def state_dict(self) -> dict:
        done = base64.b64encode(zlib.compress(np.packbits(self._done).tobytes())).decode("ascii")
        return {"lengths": _lengths_key(self.lengths), "n_docs": self.n_docs, "done": done,
                "partial": [[d, [list(p) for p in ps]] for d, ps in sorted(self._partial.items())],
                "delayed": [[d, s, n] for (d, s), n in sorted(self._delayed.items())], "counters": dict(self._c)}

    def load_state_dict(self, d: dict) -> None:
        try:
            if d["lengths"] != _lengths_key(self.lengths) or int(d["n_docs"]) != self.n_docs:
                raise TidalError(f"ledger {self.spec}: state is for other documents")
            bits = np.frombuffer(zlib.decompress(base64.b64decode(d["done"])), dtype=np.uint8)
            done = np.unpackbits(bits)[:self.n_docs].astype(bool)
            partial = {int(doc): [(int(a), int(b)) for a, b in ps] for doc, ps in d["partial"]}
            delayed = {(int(x), int(s)): int(n) for x, s, n in d["delayed"]}
            counters = {k: int(d["counters"][k]) for k in COUNTERS}
        except (KeyError, TypeError, ValueError, zlib.error) as e:
            raise TidalError(f"ledger {self.spec}: malformed state: {type(e).__name__}: {e}") from None
        self._done, self._partial, self._delayed, self._c = done, partial, delayed, counters
