"""Token corpora: documents of token ids for training, behind one interface (`TokenCorpus`).

A corpus gives the sampler its lengths and the runtime its tokens:

    corpus.length_source()              LengthSource over documents; data = each document's token count minus 1
    corpus.tokens(doc_id, start, length) int64 array of length + 1 ids: document tokens [start, start + length + 1)

A sequence of length l trains on l positions (inputs tokens[:-1], labels tokens[1:]), so it needs l + 1 tokens; a
document of n tokens is therefore a "length" of n - 1, and a split document's chunks (start, length) from the sampler
(`Step.doc_ids`, `Step.starts`, `Step.lengths`) cover its positions exactly once, consecutive chunks sharing one
boundary token (the last label of one is the first input of the next).

Specs (`corpus_from_spec`):
    stdlib                      the running Python's standard-library `.py` files (test directories excluded), bytes
    stdlib:tests                the same with test directories (test, tests, idle_test) included
    random:synthetic:NAME       a `tidal plan` length source filled with seeded random tokens (benchmarks)
    random:lengths:FILE         the same over a length file
    jsonl:PATH[:field], parquet:PATH[:column], hf:PATH[:field], dir:PATH[:suffixes]
                                real corpora, tokenized once into a cached memory-mapped index (realcorpus.py)
"""

from __future__ import annotations

import os
import re
import sysconfig
from pathlib import Path
from typing import Protocol

import numpy as np

from tidal.core.errors import TidalError
from tidal.data.sources import LengthSource, length_source

BYTE_VOCAB = 256
REAL_READERS = ("jsonl", "parquet", "hf", "dir")  # tidal.data.readers.READERS, without importing it here
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


class TokenCorpus(Protocol):
    spec: str
    vocab: int
    skipped: int  # documents left out because they are too short (< 2 tokens or < min_len)

    def length_source(self) -> LengthSource:
        ...

    def tokens(self, doc_id: int, start: int, length: int) -> np.ndarray:
        ...


def _check_range(spec: str, doc_id: int, start: int, length: int, n_docs: int | None) -> None:
    if doc_id < 0 or (n_docs is not None and doc_id >= n_docs):
        bound = "must be >= 0" if n_docs is None else f"not in 0..{n_docs - 1}"
        raise TidalError(f"corpus {spec}: document {doc_id} {bound}")
    if start < 0 or length < 1:
        raise TidalError(f"corpus {spec}: bad slice start={start} length={length} of document {doc_id}")


UNITS = ("file", "def")
_TOP_LEVEL = re.compile(rb"\n(?=(?:def |class |async def |@))")


def stdlib_root() -> Path:
    """The running Python's standard-library directory (sysconfig's `stdlib` path)."""
    return Path(sysconfig.get_paths()["stdlib"])


class StdlibCorpus:
    """The demo's standard-library code corpus: every `.py` file under the stdlib directory (site-packages and
    dist-packages excluded; test directories unless `include_tests`), in sorted relative-path order, so document ids
    are the same in every process. Tokens are the file's UTF-8 bytes (byte-level tokenizer, vocab 256). Only an index
    of (path, size) is built; bytes are read on `tokens()`."""

    vocab = BYTE_VOCAB

    def __init__(self, *, include_tests: bool = False, max_docs: int | None = None, min_len: int = 2,
                 root: str | Path | None = None, unit: str = "file") -> None:
        if min_len < 2:
            raise TidalError(f"stdlib corpus: min_len must be >= 2 tokens (a sequence needs 2), got {min_len}")
        if max_docs is not None and max_docs < 1:
            raise TidalError(f"stdlib corpus: max_docs must be >= 1, got {max_docs}")
        self.root = Path(root) if root is not None else stdlib_root()
        if not self.root.is_dir():
            raise TidalError(f"stdlib corpus: {self.root} is not a directory")
        if unit not in UNITS:
            raise TidalError(f"stdlib corpus: unit must be one of {', '.join(UNITS)}, got {unit!r}")
        self.spec = "stdlib:tests" if include_tests else ("stdlib:defs" if unit == "def" else "stdlib")
        skip = SKIP_DIRS if include_tests else SKIP_DIRS | TEST_DIRS
        found: list[tuple[str, int]] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in skip]
            for f in filenames:
                if f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    if os.path.isfile(p):
                        found.append((os.path.relpath(p, self.root), os.path.getsize(p)))
        found.sort()
        if unit == "def":
            found = self._blocks(found)
        kept = [(p, n) for p, n in found if n >= min_len]
        self.skipped = len(found) - len(kept)
        if max_docs is not None:
            kept = kept[:max_docs]
        if not kept:
            raise TidalError(f"stdlib corpus: no .py file of >= {min_len} bytes under {self.root}")
        self.paths: tuple[str, ...] = tuple(p.rsplit("@", 1)[0] for p, _ in kept)  # relative; doc_id = index
        self.offsets = np.asarray([int(p.rsplit("@", 1)[1]) if "@" in p else 0 for p, _ in kept], dtype=np.int64)
        self.sizes = np.asarray([n for _, n in kept], dtype=np.int64)  # tokens (bytes) per document
        self._lengths = LengthSource(self.spec, 0, len(kept), data=self.sizes - 1)

    def _blocks(self, files: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Split each file at top-level `def` / `class` / `async def` / decorator lines: every byte lands in exactly
        one block, named `path@offset`."""
        out = []
        for rel, _size in files:
            try:
                raw = (self.root / rel).read_bytes()
            except OSError as e:
                raise TidalError(f"corpus stdlib:defs: cannot read {self.root / rel}: {e.strerror}") from None
            cuts = [0] + [m.start() + 1 for m in _TOP_LEVEL.finditer(raw)] + [len(raw)]
            out += [(f"{rel}@{a}", b - a) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
        return out

    def __len__(self) -> int:
        return len(self.paths)

    def length_source(self) -> LengthSource:
        return self._lengths

    def tokens(self, doc_id: int, start: int, length: int) -> np.ndarray:
        doc_id, start, length = int(doc_id), int(start), int(length)
        _check_range(self.spec, doc_id, start, length, len(self.paths))
        n = int(self.sizes[doc_id])
        if start + length + 1 > n:
            raise TidalError(f"corpus {self.spec}: slice [{start}, {start + length + 1}) past the {n} tokens of "
                             f"document {doc_id} ({self.paths[doc_id]})")
        path = self.root / self.paths[doc_id]
        try:
            with open(path, "rb") as fh:
                fh.seek(int(self.offsets[doc_id]) + start)
                raw = fh.read(length + 1)
        except OSError as e:
            raise TidalError(f"corpus {self.spec}: cannot read {path}: {e.strerror}") from None
        if len(raw) != length + 1:
            raise TidalError(f"corpus {self.spec}: {path} changed since it was indexed ({n} bytes then)")
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)

    def __repr__(self) -> str:
        return f"StdlibCorpus({self.spec!r}, docs={len(self.paths)}, skipped={self.skipped}, root={str(self.root)!r})"


class RandomTokenCorpus:
    """A length spec (`synthetic:NAME` or `lengths:FILE`, as `tidal plan --data`) filled with random tokens: document
    d has length(d) + 1 tokens drawn from `default_rng([seed, d])` uniformly in [0, vocab), so any process gets the
    same tokens. The lengths are the length source's own, so plans equal `tidal plan`'s on the same spec and seed."""

    skipped = 0

    def __init__(self, length_spec: str, *, seed: int, vocab: int) -> None:
        if vocab < 2:
            raise TidalError(f"random corpus: vocab must be >= 2, got {vocab}")
        self.seed = int(seed)
        self.vocab = int(vocab)
        self._lengths = length_source(length_spec, self.seed)
        self.spec = f"random:{length_spec}"

    def length_source(self) -> LengthSource:
        return self._lengths

    def tokens(self, doc_id: int, start: int, length: int) -> np.ndarray:
        doc_id, start, length = int(doc_id), int(start), int(length)
        _check_range(self.spec, doc_id, start, length, self._lengths.size)
        n = self._lengths[doc_id] + 1
        if start + length + 1 > n:
            raise TidalError(f"corpus {self.spec}: slice [{start}, {start + length + 1}) past the {n} tokens of "
                             f"document {doc_id}")
        doc = np.random.default_rng([self.seed, doc_id]).integers(0, self.vocab, size=n, dtype=np.int64)
        return doc[start:start + length + 1].copy()

    def __repr__(self) -> str:
        return f"RandomTokenCorpus({self.spec!r}, seed={self.seed}, vocab={self.vocab})"


def corpus_from_spec(spec: str, *, seed: int, vocab: int, tokenizer: str | Path | None = None,
                     cache_dir: str | Path | None = None) -> TokenCorpus:
    """`stdlib`, `stdlib:tests`, `stdlib:defs`, `random:synthetic:NAME`, `random:lengths:FILE`, or a real corpus
    `jsonl:PATH[:field]`, `parquet:PATH[:column]`, `hf:PATH[:field]`, `dir:PATH[:suffixes]` (tokenized with the
    tokenizer.json at `tokenizer`, UTF-8 bytes when None, and cached under `cache_dir`; see `realcorpus`). `vocab`
    is the model's vocabulary: random tokens are drawn below it, and a corpus with a larger vocabulary is an error."""
    kind, _, rest = spec.partition(":")
    if kind in REAL_READERS:
        from tidal.data.realcorpus import IndexedCorpus

        corpus = IndexedCorpus(spec, tokenizer=tokenizer, cache_dir=cache_dir)
        if corpus.vocab > vocab:
            raise TidalError(f"corpus {spec} has token ids up to {corpus.vocab - 1} (tokenizer "
                             f"{corpus.tokenizer.name}) but the model's vocab is {vocab}")
        return corpus
    if tokenizer is not None:
        raise TidalError(f"a tokenizer applies to {', '.join(REAL_READERS)} corpora, not {spec!r}")
    if kind == "stdlib" and rest in ("", "tests", "defs"):
        if vocab < BYTE_VOCAB:
            raise TidalError(f"corpus {spec} is byte-level (256 token ids) but the model's vocab is {vocab}")
        return StdlibCorpus(include_tests=rest == "tests", unit="def" if rest == "defs" else "file")
    if kind == "random" and rest:
        return RandomTokenCorpus(rest, seed=seed, vocab=vocab)
    raise TidalError(f"bad corpus spec {spec!r}: expected stdlib, stdlib:tests, stdlib:defs, random:synthetic:NAME, "
                     f"random:lengths:FILE, jsonl:PATH[:field], parquet:PATH[:column], hf:PATH[:field] or "
                     f"dir:PATH[:suffixes]")
