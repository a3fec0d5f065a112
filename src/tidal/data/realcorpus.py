"""`IndexedCorpus`: a real corpus (JSONL, Parquet, `datasets`, directory of files) tokenized once into a cached,
memory-mapped token file, behind the `TokenCorpus` protocol.

    corpus = IndexedCorpus("jsonl:/data/web.jsonl:text", tokenizer="tokenizer.json", cache_dir="/scratch/tidal")
    corpus.length_source()          # lengths from the index offsets: no tokenization, no reading of the text
    corpus.tokens(doc_id, start, n) # n + 1 ids from the memory-mapped .bin
    corpus.where(doc_id)            # "file:line" / "file row N" / "file" it came from

The first open reads and tokenizes the source and writes CACHE/KIND-NAME-KEY.{bin,idx} (`tidal.data.indexed`), KEY a
hash of (reader, path, field, tokenizer sha256). Every later open stats the source files and compares (path, size,
mtime_ns) of each and the tokenizer hash with the index's fingerprint: equal -> the index is mapped as it is
(`cache_status` "hit"); different or unreadable -> rebuilt (`cache_status` "rebuilt: <why>"). Building holds an
exclusive lock on CACHE/KIND-NAME-KEY.lock, so ranks that open the same corpus at once build it once and the others
wait and map it.

Documents are skipped, and counted by reason in `skip_reasons` (total in `skipped`), when they cannot make a sequence:
`empty` (empty text), `short` (fewer than 2 tokens), and the readers' `blank_line` and `binary`. Document ids are the
kept documents in source order (files sorted, then lines / rows).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tidal.core.errors import TidalError
from tidal.data.indexed import IndexWriter, open_index, path_of
from tidal.data.readers import Source, fingerprint, iter_records, list_files, parse_source, where
from tidal.data.sources import LengthSource
from tidal.data.tokenize import ByteTokenizer, HFTokenizer, load_tokenizer

BATCH_DOCS = 512  # documents per tokenizer call
BATCH_CHARS = 8 << 20  # or this many characters, whichever comes first


def default_cache_dir(src: Source) -> Path:
    """Where an index lives when the caller names no cache directory: `.tidal-cache` beside the source (the library
    reads no environment; `tidal` commands pass `~/.cache/tidal/corpora` unless told otherwise)."""
    base = src.path if src.path.is_dir() else src.path.parent
    return base / ".tidal-cache"


def cache_prefix(src: Source, tok_sha: str, cache_dir: Path) -> Path:
    key = hashlib.sha256(json.dumps([src.kind, str(src.path), src.field, tok_sha]).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", src.path.name)[:60] or "root"
    return Path(cache_dir) / f"{src.kind}-{name}-{key}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock (atomic renames still keep readers consistent)
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stale(prefix: Path, want: dict) -> str:
    """'' if the index at `prefix` is complete and its fingerprint equals `want`, else why not."""
    if not path_of(prefix, ".idx").exists():
        return "no index"
    try:
        have = open_index(prefix).header.get("fingerprint")
    except (TidalError, OSError, ValueError, KeyError) as e:
        return f"unreadable index ({e})"
    if have == want:
        return ""
    if not isinstance(have, dict):
        return "no fingerprint"
    if have.get("tokenizer") != want["tokenizer"]:
        return "tokenizer changed"
    old = {f[0]: f[1:] for f in have.get("files", [])}
    new = {f[0]: f[1:] for f in want["files"]}
    for name in sorted(set(old) | set(new)):
        if name not in new:
            return f"{name} removed"
        if name not in old:
            return f"{name} added"
        if old[name] != new[name]:
            return f"{name} changed (size, mtime {old[name]} -> {new[name]})"
    return "configuration changed"


def build_index(src: Source, files: list[Path], want: dict, tok: ByteTokenizer | HFTokenizer, prefix: Path,
                hf_cache: Path) -> None:
    """Read and tokenize every record of `src` into PREFIX.bin / PREFIX.idx (atomically replacing an old pair)."""
    w = IndexWriter(prefix, tok.vocab)
    skipped: Counter[str] = Counter()
    batch: list[tuple[int, int, str]] = []

    def flush() -> None:
        for (fi, rec, _), ids in zip(batch, tok.encode_batch([t for _, _, t in batch])):
            if ids.size < 2:
                skipped["short"] += 1
            else:
                w.add(ids, fi, rec)
        batch.clear()

    try:
        chars = 0
        for fi, rec, text, reason in iter_records(src, files, hf_cache):
            if text is None:
                skipped[reason] += 1
            elif not text:
                skipped["empty"] += 1
            else:
                batch.append((fi, rec, text))
                chars += len(text)
                if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
                    flush()
                    chars = 0
        flush()
        skips = dict(sorted(skipped.items()))
        if w.n_docs == 0:
            raise TidalError(f"corpus {src.spec}: no document of >= 2 tokens (skipped: {skips or 'none'})")
        w.finish({"spec": src.spec, "fingerprint": want, "skipped": skips,
                  "tokenizer": tok.name})
    except BaseException:
        w.abort()
        raise


class IndexedCorpus:
    """A `TokenCorpus` over a tokenized, cached, memory-mapped real corpus (see the module docstring)."""

    def __init__(self, spec: str, *, tokenizer: str | Path | None = None, cache_dir: str | Path | None = None,
                 rebuild: bool = False) -> None:
        src = parse_source(spec)
        tok = load_tokenizer(tokenizer)
        files = list_files(src)
        fp = fingerprint(src, files)
        want = {"reader": src.kind, "path": str(src.path), "field": src.field, "tokenizer": tok.sha256,
                "files": fp}
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(src)
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TidalError(f"corpus cache directory {cache} cannot be created: {e.strerror}") from None
        self.prefix = cache_prefix(src, tok.sha256, cache)
        with _locked(path_of(self.prefix, ".lock")):
            why = "rebuild requested" if rebuild else _stale(self.prefix, want)
            if why:
                build_index(src, files, want, tok, self.prefix, cache / "hf")
                self.cache_status = "built" if why == "no index" else f"rebuilt: {why}"
            else:
                self.cache_status = "hit"
            self._index = open_index(self.prefix)
        h = self._index.header
        self.source = src
        self.spec = spec
        self.tokenizer = tok
        self.vocab = int(h["vocab"])
        self.skip_reasons: dict[str, int] = dict(h["skipped"])
        self.skipped = sum(self.skip_reasons.values())
        self._files = [f[0] for f in h["fingerprint"]["files"]]
        self.sizes = np.diff(self._index.offsets)  # tokens per document
        fp_key = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:12]
        # The sampler checks this spec on resume: a changed source or tokenizer cannot resume an old position.
        self._lengths = LengthSource(f"{src.spec}#{tok.sha256[:12]}:{fp_key}", 0, len(self.sizes),
                                     data=self.sizes - 1)

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def tokens_total(self) -> int:
        return int(self._index.offsets[-1])

    def length_source(self) -> LengthSource:
        return self._lengths

    def tokens(self, doc_id: int, start: int, length: int) -> np.ndarray:
        doc_id, start, length = int(doc_id), int(start), int(length)
        n_docs = len(self.sizes)
        if doc_id < 0 or doc_id >= n_docs:
            raise TidalError(f"corpus {self.spec}: document {doc_id} not in 0..{n_docs - 1}")
        if start < 0 or length < 1:
            raise TidalError(f"corpus {self.spec}: bad slice start={start} length={length} of document {doc_id}")
        n = int(self.sizes[doc_id])
        if start + length + 1 > n:
            raise TidalError(f"corpus {self.spec}: slice [{start}, {start + length + 1}) past the {n} tokens of "
                             f"document {doc_id} ({self.where(doc_id)})")
        o = int(self._index.offsets[doc_id]) + start
        return np.asarray(self._index.tokens[o:o + length + 1], dtype=np.int64)

    def where(self, doc_id: int) -> str:
        """Where document `doc_id` came from: `file:line`, `file row N` or `file`."""
        d = int(doc_id)
        return where(self.source, self._files, int(self._index.file_of[d]), int(self._index.record_of[d]))

    def __repr__(self) -> str:
        return (f"IndexedCorpus({self.spec!r}, docs={len(self)}, tokens={self.tokens_total}, vocab={self.vocab}, "
                f"skipped={self.skipped}, cache={self.cache_status!r})")
