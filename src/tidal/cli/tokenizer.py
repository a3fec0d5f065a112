"""`tidal tokenizer train`: a byte-level BPE from local text; `tidal tokenizer index`: tokenize a corpus into its
cached memory-mapped index (so training and planning start from the index) and print its statistics.

Nothing is fetched from a hub. `--input` takes corpus specs (jsonl:PATH[:field], parquet:PATH[:column],
hf:PATH[:field], dir:PATH[:suffixes]) or plain paths: a directory is read as dir:PATH, a .jsonl / .parquet file as
jsonl: / parquet:, any other file as one text.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tidal.core.errors import TidalError


def add_parser(sub) -> None:
    p = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer; tokenize and index a corpus",
                       description=__doc__)
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="train a byte-level BPE from local text and write tokenizer.json")
    t.add_argument("--input", action="append", required=True,
                   help="corpus spec or path (repeatable): jsonl:PATH[:field], parquet:..., hf:..., dir:..., a "
                        "directory, a .jsonl/.parquet file or a text file")
    t.add_argument("--vocab", type=int, required=True, help="vocabulary size (>= 257: 256 bytes + <|endoftext|>)")
    t.add_argument("--out", type=Path, required=True, help="tokenizer.json to write")
    t.add_argument("--max-bytes", type=int, default=16 << 20,
                   help="train on about this many bytes of text (default 16 MiB; 0 = all)")
    t.add_argument("--min-frequency", type=int, default=2, help="pairs seen fewer times are not merged")
    t.add_argument("--cache-dir", type=Path, default=None, help="cache for hf: inputs (default ~/.cache/tidal)")
    t.set_defaults(func=run_train)
    i = tsub.add_parser("index", help="tokenize a corpus into its cached index (reused by tidal train) and print it")
    i.add_argument("--data", required=True, help="jsonl:PATH[:field], parquet:PATH[:column], hf:PATH[:field] or "
                                                 "dir:PATH[:suffixes]")
    i.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (default: UTF-8 bytes)")
    i.add_argument("--cache-dir", type=Path, default=None, help="index cache (default ~/.cache/tidal/corpora)")
    i.add_argument("--rebuild", action="store_true", help="rebuild even if the cached index is current")
    i.add_argument("--lengths-out", type=Path, default=None,
                   help="also write the document lengths (tokens - 1) as .npy, for tidal plan --data lengths:FILE")
    i.set_defaults(func=run_index)


def _as_spec(item: str) -> str | Path:
    kind = item.partition(":")[0]
    if kind in ("jsonl", "parquet", "hf", "dir") and not Path(item).exists():
        return item
    p = Path(item)
    if p.is_dir():
        return f"dir:{p}"
    if p.suffix in (".jsonl", ".parquet"):
        return f"{p.suffix[1:]}:{p}"
    if not p.is_file():
        raise TidalError(f"--input {item}: no such file or directory")
    return p


def _texts(inputs: list[str], cache_dir: Path, max_bytes: int | None, seen: list[int]) -> Iterator[str]:
    from tidal.data.readers import iter_texts

    for item in inputs:
        spec = _as_spec(item)
        if isinstance(spec, Path):
            try:
                text = spec.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise TidalError(f"--input {spec}: cannot read as UTF-8 text ({e})") from None
            texts: Iterator[str] = iter([text])
        else:
            texts = iter_texts(spec, cache_dir, None if max_bytes is None else max_bytes - seen[0])
        for t in texts:
            seen[0] += len(t.encode("utf-8"))
            yield t
            if max_bytes is not None and seen[0] >= max_bytes:
                return


def run_train(args) -> int:
    from tidal.data.tokenize import train_bpe

    if args.max_bytes < 0:
        raise TidalError(f"--max-bytes must be >= 0, got {args.max_bytes}")
    if args.out.is_dir():
        raise TidalError(f"--out {args.out} is a directory; give the tokenizer.json file to write")
    cache = args.cache_dir or user_cache_dir()
    seen = [0]
    t0 = time.perf_counter()
    tok = train_bpe(_texts(args.input, cache / "hf", args.max_bytes or None, seen), args.vocab, args.out,
                    min_frequency=args.min_frequency)
    dt = time.perf_counter() - t0
    if seen[0] == 0:
        raise TidalError("no text in --input")
    print(f"wrote {args.out}: byte-level BPE, vocab {tok.vocab}, trained on {seen[0] / 1e6:.1f} MB in {dt:.1f} s")
    return 0


def run_index(args) -> int:
    from tidal.data.realcorpus import IndexedCorpus

    t0 = time.perf_counter()
    c = IndexedCorpus(args.data, tokenizer=args.tokenizer, cache_dir=args.cache_dir or user_cache_dir(),
                      rebuild=args.rebuild)
    dt = time.perf_counter() - t0
    n = c.sizes
    q = np.percentile(n, [50, 90, 99]).astype(int)
    print(f"{c.spec}: {len(c)} documents, {c.tokens_total} tokens, vocab {c.vocab} ({c.tokenizer.name})")
    print(f"tokens/document: median {q[0]}, p90 {q[1]}, p99 {q[2]}, max {int(n.max())}")
    print(f"skipped: {c.skipped} {c.skip_reasons or ''}".rstrip())
    print(f"index: {c.prefix}.{{bin,idx}} ({c.cache_status}, {dt:.2f} s)")
    if args.lengths_out is not None:
        lengths = c.length_source().lengths(0, len(c))
        try:
            np.save(args.lengths_out, lengths)
        except OSError as e:
            raise TidalError(f"cannot write {args.lengths_out}: {e.strerror}") from None
        print(f"lengths: {args.lengths_out} ({len(lengths)} documents; tidal plan --data lengths:{args.lengths_out})")
    return 0


def user_cache_dir() -> Path:
    """The commands' default index cache (the CLI is the only layer that reads the environment)."""
    return Path.home() / ".cache" / "tidal" / "corpora"
