"""Token-budget step sampler with a long-document policy and a resumable state.

Each step takes documents in a seeded random order (no length bucketing) until the step holds `tokens_per_step`
tokens: a sequence is added while the step's total stays <= the budget; the first sequence that would overflow it
starts the next step instead (it is not consumed). A step always holds at least one sequence, so a single sequence
longer than the budget (possible only when max_len > tokens_per_step) forms a step of its own.

Long documents (length > max_len) follow `long_docs`:
  split     (default) the document becomes n = ceil(l / max_len) consecutive chunks of near-equal length (they differ
            by at most one token), each a new sequence with its own seq_id and the same doc_id; chunks may straddle a
            step boundary. Near-equal chunks instead of max_len + remainder avoid a tiny tail chunk.
  truncate  the document is cut to its first max_len tokens; the cut tokens are counted in the stats.
  error     TidalError naming the document.
Nothing is dropped silently: every split and truncation is counted, per step and cumulatively in the state.

Order: infinite (synthetic) sources are i.i.d. draws, so their index order is already random; finite (file)
sources are visited in a permutation per epoch drawn from `default_rng([seed, epoch])` (or in file order with
shuffle=False). At the end of a finite source the sampler stops (`next_step()` returns None after a last, possibly
partial, step) unless cycle=True, which starts a new epoch with a fresh permutation.

The state is a small frozen dataclass with to_dict/from_dict; (seed, epoch) determine the permutation rng, so the
rng state is the pair itself and resuming costs O(1) for synthetic sources and one permutation for files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from tidal.core.errors import TidalError
from tidal.data.sources import LengthSource, length_source

LONG_DOC_POLICIES = ("split", "truncate", "error")


@dataclass(frozen=True)
class LongDocStats:
    docs: int = 0  # documents started
    tokens: int = 0  # tokens emitted
    split_docs: int = 0
    split_extra_seqs: int = 0  # sequences beyond the first that splitting created
    split_tokens: int = 0  # tokens of split documents (all emitted)
    truncated_docs: int = 0
    truncated_tokens: int = 0  # tokens cut off (not emitted)

    def __add__(self, o: LongDocStats) -> LongDocStats:
        return LongDocStats(*(getattr(self, f.name) + getattr(o, f.name) for f in fields(self)))

    def __sub__(self, o: LongDocStats) -> LongDocStats:
        return LongDocStats(*(getattr(self, f.name) - getattr(o, f.name) for f in fields(self)))


@dataclass(frozen=True)
class SamplerState:
    source: str  # spec string of the source, checked on resume
    seed: int
    tokens_per_step: int
    max_len: int
    long_docs: str
    shuffle: bool = True
    cycle: bool = False
    step: int = 0  # steps emitted so far
    epoch: int = 0
    position: int = 0  # next index into this epoch's order
    chunk: int = 0  # next chunk of the document at `position` (0 unless a split straddles a step boundary)
    next_seq_id: int = 0
    stats: LongDocStats = LongDocStats()

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> SamplerState:
        try:
            d = dict(d)
            st = LongDocStats(**d.pop("stats", {}))
            return SamplerState(**d, stats=st)
        except TypeError as e:
            raise TidalError(f"malformed sampler state: {e}") from None


@dataclass(frozen=True)
class Step:
    index: int
    seq_ids: tuple[int, ...]  # running sequence ids (positions in the sampled stream)
    lengths: tuple[int, ...]
    doc_ids: tuple[int, ...]  # index of the source document each sequence came from
    chunks: tuple[int, ...]  # chunk number within its document (0 for unsplit documents)
    stats: LongDocStats  # this step's counts
    starts: tuple[int, ...] = ()  # offset of each sequence within its document (0 unless a later chunk of a split)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def lengths_array(self) -> np.ndarray:
        return np.asarray(self.lengths, dtype=np.int64)


def split_sizes(length: int, max_len: int) -> list[int]:
    """Near-equal consecutive chunk sizes (<= max_len each) of a document of `length` tokens."""
    n = -(-length // max_len)
    q, r = divmod(length, n)
    return [q + (1 if k < r else 0) for k in range(n)]


class TokenBudgetSampler:
    """Draw steps of about `tokens_per_step` tokens from `source`; `state` resumes an earlier run exactly."""

    def __init__(self, source: LengthSource, tokens_per_step: int, max_len: int, *, long_docs: str = "split",
                 seed: int = 0, shuffle: bool = True, cycle: bool = False, state: SamplerState | None = None) -> None:
        if tokens_per_step < 1:
            raise TidalError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
        if max_len < 1:
            raise TidalError(f"max_len must be >= 1, got {max_len}")
        if seed < 0:
            raise TidalError(f"seed must be >= 0, got {seed}")
        if long_docs not in LONG_DOC_POLICIES:
            choices = ", ".join(LONG_DOC_POLICIES)
            raise TidalError(f"unknown long-document policy {long_docs!r}; choose one of {choices}")
        fresh = SamplerState(source.spec, int(seed), int(tokens_per_step), int(max_len), long_docs, shuffle, cycle)
        if state is not None:
            mine = (fresh.source, fresh.seed, fresh.tokens_per_step, fresh.max_len, fresh.long_docs, fresh.shuffle,
                    fresh.cycle)
            theirs = (state.source, state.seed, state.tokens_per_step, state.max_len, state.long_docs, state.shuffle,
                      state.cycle)
            if mine != theirs:
                raise TidalError(f"sampler state does not match this configuration: state {theirs} vs {mine}")
        self.source = source
        self._state = state or fresh
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def state(self) -> SamplerState:
        return self._state

    @property
    def long_doc_stats(self) -> dict:
        """Cumulative long-document counts (`LongDocStats` as a dict)."""
        return asdict(self._state.stats)

    def state_dict(self) -> dict:
        """JSON-safe state (`SamplerState.to_dict`); `load_state_dict` resumes from it exactly."""
        return self._state.to_dict()

    def load_state_dict(self, d: dict) -> None:
        """Resume from `state_dict()` output; the configuration must match (TidalError otherwise)."""
        st = SamplerState.from_dict(d)
        mine = (self._state.source, self._state.seed, self._state.tokens_per_step, self._state.max_len,
                self._state.long_docs, self._state.shuffle, self._state.cycle)
        theirs = (st.source, st.seed, st.tokens_per_step, st.max_len, st.long_docs, st.shuffle, st.cycle)
        if mine != theirs:
            raise TidalError(f"sampler state does not match this configuration: state {theirs} vs {mine}")
        self._state = st

    def _doc_at(self, epoch: int, position: int) -> int:
        if self.source.size is None or not self._state.shuffle:
            return position
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self._state.seed, epoch]).permutation(self.source.size))
        return int(self._order[1][position])

    def next_step(self) -> Step | None:
        """The next step, or None once a finite source (without cycle) is exhausted."""
        s = self._state
        epoch, pos, chunk, sid = s.epoch, s.position, s.chunk, s.next_seq_id
        stats = LongDocStats()
        seq_ids: list[int] = []
        lens: list[int] = []
        docs: list[int] = []
        chunks: list[int] = []
        starts: list[int] = []
        total = 0
        size, budget, max_len = self.source.size, s.tokens_per_step, s.max_len
        while total < budget:
            if size is not None and pos >= size:
                if not s.cycle:
                    break
                epoch, pos, chunk = epoch + 1, 0, 0
            doc = self._doc_at(epoch, pos)
            length = self.source[doc]
            if length <= max_len:
                pieces, cut = [length], 0
            elif s.long_docs == "split":
                pieces, cut = split_sizes(length, max_len), 0
            elif s.long_docs == "truncate":
                pieces, cut = [max_len], length - max_len
            else:
                raise TidalError(f"document {doc} of {self.source.spec} has {length} tokens > max_len {max_len} "
                                 f"(use --long-docs split or truncate)")
            piece = pieces[chunk]
            if seq_ids and total + piece > budget:
                break
            if chunk == 0:
                stats += LongDocStats(docs=1, split_docs=int(len(pieces) > 1), split_tokens=length * (len(pieces) > 1),
                                      truncated_docs=int(cut > 0), truncated_tokens=cut)
            else:
                stats += LongDocStats(split_extra_seqs=1)
            stats += LongDocStats(tokens=piece)
            seq_ids.append(sid)
            lens.append(piece)
            docs.append(doc)
            chunks.append(chunk)
            starts.append(sum(pieces[:chunk]))
            sid += 1
            total += piece
            if chunk + 1 < len(pieces):
                chunk += 1
            else:
                pos, chunk = pos + 1, 0
        if not seq_ids:
            return None
        step = Step(s.step, tuple(seq_ids), tuple(lens), tuple(docs), tuple(chunks), stats, tuple(starts))
        self._state = replace(s, step=s.step + 1, epoch=epoch, position=pos, chunk=chunk, next_seq_id=sid,
                              stats=s.stats + stats)
        return step

    def steps(self, n: int | None = None) -> Iterator[Step]:
        """Up to `n` steps (all remaining steps of a finite source when n is None)."""
        if n is None and self.source.size is None:
            raise TidalError("an infinite source needs a step count")
        k = 0
        while n is None or k < n:
            st = self.next_step()
            if st is None:
                return
            yield st
            k += 1


def sample_steps(spec_or_source: str | LengthSource, *, seed: int, tokens_per_step: int, max_len: int, steps: int,
                 long_docs: str = "split", shuffle: bool = True, cycle: bool = False,
                 state: SamplerState | None = None) -> tuple[list[Step], SamplerState]:
    """Convenience for the CLI: `steps` steps (fewer if a finite source ends) and the state to resume from."""
    src = length_source(spec_or_source, seed) if isinstance(spec_or_source, str) else spec_or_source
    sampler = TokenBudgetSampler(src, tokens_per_step, max_len, long_docs=long_docs, seed=seed, shuffle=shuffle,
                                 cycle=cycle, state=state)
    out = list(sampler.steps(steps))
    return out, sampler.state
