"""Readers of real text corpora: JSONL, Parquet, Hugging Face `datasets`, and directories of text or code files.

    jsonl:PATH[:FIELD]     a .jsonl file, or a directory of them (sorted); one JSON object per line, text in FIELD
                           (default "text")
    parquet:PATH[:COLUMN]  a .parquet file, or a directory of them (sorted); a string COLUMN (default "text")
    hf:PATH[:FIELD]        a `datasets` dataset saved with save_to_disk (its "train" split if it is a DatasetDict), or
                           local data files (.json/.jsonl/.parquet/.csv/.txt, a file or a directory of one kind) that
                           `datasets.load_dataset` builds; a string FIELD (default "text")
    dir:PATH[:SUFFIXES]    every regular file under PATH (recursively, sorted; hidden names and __pycache__ left
                           out), one document per file, optionally only those ending in one of SUFFIXES (".py,.md")

A reader yields records `(file index, record number, text or None, skip reason)`: the record number is the 1-based
line of a JSONL file and the 0-based row of a Parquet file or dataset (0 for a file of `dir:`). Malformed input is an
error naming the file and line or row (bad JSON, not an object, missing or non-string field, null value, undecodable
line, unreadable or non-Parquet file, a dataset that does not load); documented skips are yielded with a reason
and counted by the index builder: `blank_line` (an empty JSONL line) and `binary` (a `dir:` file that is not UTF-8
text or holds a NUL byte). pyarrow and datasets are imported inside the functions that use them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tidal.core.errors import TidalError

READERS = ("jsonl", "parquet", "hf", "dir")
DEFAULT_FIELD = {"jsonl": "text", "parquet": "text", "hf": "text", "dir": ""}
HF_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
HF_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
SKIP_NAMES = frozenset({"__pycache__"})
BATCH_ROWS = 1024

Record = tuple[int, int, "str | None", str]  # file index, record number, text (None: skipped), skip reason


@dataclass(frozen=True)
class Source:
    kind: str  # jsonl | parquet | hf | dir
    path: Path  # absolute
    field: str  # text field / column; for dir: comma-separated suffixes ("" = every file)

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.path}" + (f":{self.field}" if self.field else "")


def parse_source(spec: str) -> Source:
    """`KIND:PATH[:FIELD]`. PATH is taken whole when it exists (so it may contain ':'), else split at the last ':'."""
    kind, sep, rest = spec.partition(":")
    if kind not in READERS or not sep or not rest:
        raise TidalError(f"bad corpus spec {spec!r}: expected one of {', '.join(k + ':PATH' for k in READERS)}")
    path, field = rest, DEFAULT_FIELD[kind]
    if not Path(rest).exists() and ":" in rest:
        path, _, field = rest.rpartition(":")
        if not field:
            raise TidalError(f"bad corpus spec {spec!r}: empty field after ':'")
    p = Path(path)
    if not p.exists():
        raise TidalError(f"corpus {spec}: {p} does not exist")
    return Source(kind, p.resolve(), field)


def _walk(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_NAMES)
        for f in filenames:
            if not f.startswith(".") and (not suffixes or f.endswith(suffixes)):
                p = Path(dirpath) / f
                if p.is_file() or p.is_symlink():  # a dangling link is listed, so reading it names the file
                    out.append(p)
    return sorted(out)


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in HF_SAVED_MARKERS)


def list_files(src: Source) -> list[Path]:
    """The source's files in a fixed (sorted) order; their index is the file index of a record."""
    p = src.path
    if src.kind == "dir":
        if not p.is_dir():
            raise TidalError(f"corpus {src.spec}: {p} is not a directory")
        suffixes = tuple(s.strip() for s in src.field.split(",") if s.strip())
        files = _walk(p, suffixes)
    elif src.kind == "hf" and is_saved_dataset(p):
        files = _walk(p, ())
    else:
        suffixes = {"jsonl": (".jsonl",), "parquet": (".parquet",), "hf": tuple(HF_BUILDERS)}[src.kind]
        files = [p] if p.is_file() else _walk(p, suffixes)
    if not files:
        raise TidalError(f"corpus {src.spec}: no input files under {p}")
    return files


def fingerprint(src: Source, files: list[Path]) -> list[list]:
    """[[path relative to the source, size, mtime_ns], ...]: what a cached index is checked against."""
    out = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError as e:
            raise TidalError(f"corpus {src.spec}: cannot read {f}: {e.strerror}") from None
        rel = f.name if f == src.path else os.path.relpath(f, src.path)
        out.append([rel, int(st.st_size), int(st.st_mtime_ns)])
    return out


def where(src: Source, files: list[str], file_index: int, record: int) -> str:
    """Human-readable location of a record: `file:line` (JSONL), `file row N` (Parquet, datasets), `file` (dir)."""
    f = src.path / files[file_index] if src.path.is_dir() else src.path
    if src.kind == "jsonl":
        return f"{f}:{record}"
    if src.kind == "dir":
        return str(f)
    return f"{src.path if src.kind == 'hf' else f} row {record}"


def _jsonl(src: Source, fi: int, f: Path) -> Iterator[Record]:
    field = src.field
    try:
        with open(f, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                s = raw.strip()
                if not s:
                    yield fi, n, None, "blank_line"
                    continue
                try:
                    obj = json.loads(s)
                except UnicodeDecodeError:
                    raise TidalError(f"{f}:{n}: not valid UTF-8") from None
                except json.JSONDecodeError as e:
                    raise TidalError(f"{f}:{n}: bad JSON: {e.msg} (column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise TidalError(f"{f}:{n}: expected a JSON object, got {type(obj).__name__}")
                if field not in obj:
                    have = ", ".join(list(obj)[:8]) or "none"
                    raise TidalError(f"{f}:{n}: missing field {field!r} (fields: {have})")
                v = obj[field]
                if not isinstance(v, str):
                    raise TidalError(f"{f}:{n}: field {field!r} is {type(v).__name__}, expected a string")
                yield fi, n, v, ""
    except OSError as e:
        raise TidalError(f"corpus {src.spec}: cannot read {f}: {e.strerror or e}") from None


def _parquet(src: Source, fi: int, f: Path) -> Iterator[Record]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TidalError("parquet corpora need the 'pyarrow' package: pip install 'tidal[data]'") from None
    try:
        pf = pq.ParquetFile(f)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise TidalError(f"{f}: not a readable Parquet file ({str(e).splitlines()[0][:160]})") from None
    schema = pf.schema_arrow
    if src.field not in schema.names:
        raise TidalError(f"{f}: missing column {src.field!r} (columns: {', '.join(schema.names[:8])})")
    typ = schema.field(src.field).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise TidalError(f"{f}: column {src.field!r} is {typ}, expected a string column")
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[src.field]):
            for v in batch.column(0).to_pylist():
                if v is None:
                    raise TidalError(f"{f} row {row}: column {src.field!r} is null")
                yield fi, row, v, ""
                row += 1
    except (OSError, pa.ArrowException) as e:
        raise TidalError(f"{f} row {row}: cannot read ({str(e).splitlines()[0][:160]})") from None


def _dataset(src: Source, files: list[Path], cache_dir: Path):
    try:
        import datasets
    except ImportError:
        raise TidalError("hf corpora need the 'datasets' package: pip install 'tidal[data]'") from None
    try:
        if is_saved_dataset(src.path):
            ds = datasets.load_from_disk(str(src.path))
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise TidalError(f"corpus {src.spec}: a DatasetDict without a 'train' split ({', '.join(ds)})")
                ds = ds["train"]
        else:
            kinds = {HF_BUILDERS.get(f.suffix) for f in files}
            if len(kinds) != 1 or None in kinds:
                raise TidalError(f"corpus {src.spec}: data files must be of one kind "
                                 f"({', '.join(sorted(HF_BUILDERS))}), got {sorted({f.suffix for f in files})}")
            ds = datasets.load_dataset(kinds.pop(), data_files=[str(f) for f in files], split="train",
                                       cache_dir=str(cache_dir))
    except TidalError:
        raise
    except Exception as e:  # datasets raises many types (FileNotFoundError, DatasetGenerationError, ArrowInvalid..)
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise TidalError(f"corpus {src.spec}: cannot load the dataset: {type(e).__name__}: {msg}") from None
    if src.field not in ds.column_names:
        raise TidalError(f"corpus {src.spec}: missing field {src.field!r} (fields: {', '.join(ds.column_names[:8])})")
    feat = ds.features[src.field]
    if getattr(feat, "dtype", None) not in ("string", "large_string"):
        raise TidalError(f"corpus {src.spec}: field {src.field!r} is {feat}, expected a string")
    return ds.select_columns([src.field])


def _hf(src: Source, files: list[Path], cache_dir: Path) -> Iterator[Record]:
    ds = _dataset(src, files, cache_dir)
    row = 0
    for batch in ds.iter(batch_size=BATCH_ROWS):
        for v in batch[src.field]:
            if v is None:
                raise TidalError(f"{src.path} row {row}: field {src.field!r} is null")
            yield 0, row, v, ""
            row += 1


def _dir(src: Source, fi: int, f: Path) -> Iterator[Record]:
    try:
        raw = f.read_bytes()
    except OSError as e:
        raise TidalError(f"corpus {src.spec}: cannot read {f}: {e.strerror or e}") from None
    if b"\0" in raw:
        yield fi, 0, None, "binary"
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        yield fi, 0, None, "binary"
        return
    yield fi, 0, text, ""


def iter_records(src: Source, files: list[Path], cache_dir: Path) -> Iterator[Record]:
    """Every record of the source in order; `cache_dir` is where `datasets` may cache what it builds."""
    if src.kind == "hf":
        yield from _hf(src, files, cache_dir)
        return
    read = {"jsonl": _jsonl, "parquet": _parquet, "dir": _dir}[src.kind]
    for fi, f in enumerate(files):
        yield from read(src, fi, f)


def iter_texts(spec: str, cache_dir: Path, max_bytes: int | None = None) -> Iterator[str]:
    """The non-empty texts of a corpus spec, up to about `max_bytes` of UTF-8 (tokenizer training)."""
    src = parse_source(spec)
    seen = 0
    for _, _, text, _ in iter_records(src, list_files(src), cache_dir):
        if text:
            yield text
            seen += len(text.encode("utf-8"))
            if max_bytes is not None and seen >= max_bytes:
                return
