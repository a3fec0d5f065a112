"""Memory-mapped token files in the style of Megatron's indexed datasets: PREFIX.bin + PREFIX.idx.

PREFIX.bin   the token ids of every document, concatenated, little-endian uint8 / uint16 / uint32 (the narrowest
             that holds the vocabulary)
PREFIX.idx   b"TIDALIDX" | uint64 header length H | H bytes of JSON header (space padded to a multiple of 8) |
             int64 offsets[n + 1] (token offsets of the documents in .bin; offsets[0] = 0) |
             int64 file_of[n] | int64 record_of[n] (where each document came from, for messages)

The JSON header holds `format`, `dtype`, `n_docs`, `tokens`, `vocab`, `skipped` ({reason: count}), `files` (the
source files as [relative path, size, mtime_ns]) and `fingerprint` (reader, path, field, tokenizer sha256 and the
files list): a cached index is reused only when the fingerprint equals the source's current one. The offsets are the
length index (document id -> token count): opening an index reads them and maps .bin, and never tokenizes.

Writers write PREFIX.bin.tmp / PREFIX.idx.tmp and rename them into place (.bin first, .idx last), so a reader sees
either the old pair or the new one; `open_index` also checks that .bin holds exactly offsets[-1] ids.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidal.core.errors import TidalError

MAGIC = b"TIDALIDX"
FORMAT = 1


def path_of(prefix: Path, ext: str) -> Path:
    """PREFIX + ext (not with_suffix: a prefix may contain dots)."""
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + ext)


def token_dtype(vocab: int) -> np.dtype:
    """Narrowest unsigned dtype that holds ids < vocab."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if vocab <= np.iinfo(dt).max + 1:
            return np.dtype(dt).newbyteorder("<")
    raise TidalError(f"vocabulary {vocab} does not fit in uint32 token ids")


class IndexWriter:
    """Append documents (arrays of ids) to PREFIX.bin.tmp; `finish(header)` writes the .idx and renames both."""

    def __init__(self, prefix: Path, vocab: int) -> None:
        self.prefix = Path(prefix)
        self.vocab = int(vocab)
        self.dtype = token_dtype(vocab)
        self._bin_tmp = self.prefix.with_name(self.prefix.name + f".bin.tmp{os.getpid()}")
        self._fh = open(self._bin_tmp, "wb")  # noqa: SIM115 - closed in finish() / abort()
        self._lengths: list[int] = []
        self._file_of: list[int] = []
        self._record_of: list[int] = []

    def add(self, ids: np.ndarray, file_index: int, record: int) -> None:
        if ids.size and (int(ids.max()) >= self.vocab or int(ids.min()) < 0):
            raise TidalError(f"token id out of range [0, {self.vocab}) in file {file_index} record {record}")
        self._fh.write(ids.astype(self.dtype, copy=False).tobytes())
        self._lengths.append(int(ids.size))
        self._file_of.append(int(file_index))
        self._record_of.append(int(record))

    @property
    def n_docs(self) -> int:
        return len(self._lengths)

    def abort(self) -> None:
        self._fh.close()
        self._bin_tmp.unlink(missing_ok=True)

    def finish(self, header: dict) -> None:
        self._fh.close()
        offsets = np.zeros(len(self._lengths) + 1, dtype="<i8")
        np.cumsum(np.asarray(self._lengths, dtype=np.int64), out=offsets[1:])
        header = {**header, "format": FORMAT, "dtype": self.dtype.name, "n_docs": len(self._lengths),
                  "tokens": int(offsets[-1]), "vocab": self.vocab}
        raw = json.dumps(header, sort_keys=True).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        idx_tmp = self.prefix.with_name(self.prefix.name + f".idx.tmp{os.getpid()}")
        with open(idx_tmp, "wb") as fh:
            fh.write(MAGIC + struct.pack("<Q", len(raw)) + raw)
            fh.write(offsets.tobytes())
            fh.write(np.asarray(self._file_of, dtype="<i8").tobytes())
            fh.write(np.asarray(self._record_of, dtype="<i8").tobytes())
        os.replace(self._bin_tmp, path_of(self.prefix, ".bin"))
        os.replace(idx_tmp, path_of(self.prefix, ".idx"))


@dataclass(frozen=True)
class Index:
    header: dict
    offsets: np.ndarray  # int64 [n + 1]
    file_of: np.ndarray  # int64 [n]
    record_of: np.ndarray  # int64 [n]
    tokens: np.ndarray  # memory-mapped .bin

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1


def read_header(prefix: Path) -> tuple[dict, int]:
    """(header, byte offset of the arrays) of PREFIX.idx; TidalError if it is not an index file."""
    p = path_of(prefix, ".idx")
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
            if len(head) != 16 or head[:8] != MAGIC:
                raise TidalError(f"{p}: not a tidal index file")
            (n,) = struct.unpack("<Q", head[8:])
            raw = fh.read(n)
    except OSError as e:
        raise TidalError(f"cannot read index {p}: {e.strerror}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TidalError(f"{p}: corrupt index header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TidalError(f"{p}: index format {header.get('format') if isinstance(header, dict) else '?'} "
                         f"is not {FORMAT}")
    return header, 16 + n


def open_index(prefix: Path) -> Index:
    """Map PREFIX.idx and PREFIX.bin (read only). TidalError if either is missing, truncated or inconsistent."""
    prefix = Path(prefix)
    header, off = read_header(prefix)
    n = int(header["n_docs"])
    idx_path, bin_path = path_of(prefix, ".idx"), path_of(prefix, ".bin")
    want = off + 8 * (n + 1) + 16 * n
    if idx_path.stat().st_size != want:
        raise TidalError(f"{idx_path}: {idx_path.stat().st_size} bytes, expected {want} (truncated?)")
    arrays = np.memmap(idx_path, dtype="<i8", mode="r", offset=off, shape=(3 * n + 1,))
    offsets = np.asarray(arrays[:n + 1], dtype=np.int64)
    dtype = np.dtype(header["dtype"]).newbyteorder("<")
    size = bin_path.stat().st_size if bin_path.exists() else -1
    if size != int(offsets[-1]) * dtype.itemsize or int(header["tokens"]) != int(offsets[-1]):
        raise TidalError(f"{bin_path}: {size} bytes, expected {int(offsets[-1]) * dtype.itemsize}")
    tokens = (np.memmap(bin_path, dtype=dtype, mode="r") if size > 0 else np.zeros(0, dtype=dtype))
    return Index(header, offsets, arrays[n + 1:2 * n + 1], arrays[2 * n + 1:], tokens)
