"""Real corpora: JSONL / Parquet / datasets / dir readers give the same documents; tokens are the text's; the cached
index is reused without tokenizing and rebuilt when the source or tokenizer changes."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from realdata import texts, write_jsonl

from tidal.core import TidalError
from tidal.data import TokenBudgetSampler, corpus_from_spec
from tidal.data import realcorpus as rc
from tidal.data.indexed import open_index, path_of
from tidal.data.tokenize import train_bpe

pytestmark = pytest.mark.unit

DOCS = texts(40, seed=1)


def _bytes_doc(c, d):
    return c.tokens(d, 0, int(c.sizes[d]) - 1)


def _check_same_as(c, docs):
    assert len(c) == len(docs) and c.skipped == 0
    for d, t in enumerate(docs):
        assert bytes(_bytes_doc(c, d).astype(np.uint8)) == t.encode("utf-8")
    np.testing.assert_array_equal(c.length_source().lengths(0, len(c)), [len(t.encode()) - 1 for t in docs])


def test_jsonl_bytes_are_the_text(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", DOCS)
    c = corpus_from_spec(f"jsonl:{p}", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    assert c.vocab == 256 and c.cache_status == "built"
    _check_same_as(c, DOCS)
    assert c.where(3) == f"{p.resolve()}:4"
    assert c.tokens(5, 2, 3).dtype == np.int64 and len(c.tokens(5, 2, 3)) == 4
    with pytest.raises(TidalError, match="past the"):
        c.tokens(0, 0, int(c.sizes[0]))
    with pytest.raises(TidalError, match="not in 0"):
        c.tokens(len(c), 0, 1)


def test_jsonl_field_and_directory(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    write_jsonl(d / "b.jsonl", DOCS[20:], field="content")
    write_jsonl(d / "a.jsonl", DOCS[:20], field="content")
    (d / "notes.txt").write_text("not a shard")
    c = corpus_from_spec(f"jsonl:{d}:content", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    _check_same_as(c, DOCS)  # files in sorted order
    assert c.where(20) == f"{(d / 'b.jsonl').resolve()}:1"


def test_parquet_same_documents(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"body": DOCS, "n": list(range(len(DOCS)))}), p, row_group_size=7)
    c = corpus_from_spec(f"parquet:{p}:body", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    _check_same_as(c, DOCS)
    assert c.where(9) == f"{p.resolve()} row 9"


def test_hf_saved_and_built_from_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))}).save_to_disk(str(saved))
    c = corpus_from_spec(f"hf:{saved}", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    _check_same_as(c, DOCS)
    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"t": DOCS})}).save_to_disk(str(dd))
    _check_same_as(corpus_from_spec(f"hf:{dd}:t", seed=0, vocab=256, cache_dir=tmp_path / "cache"), DOCS)
    p = write_jsonl(tmp_path / "a.jsonl", DOCS)
    _check_same_as(corpus_from_spec(f"hf:{p}", seed=0, vocab=256, cache_dir=tmp_path / "cache"), DOCS)


def test_dir_of_files(tmp_path):
    root = tmp_path / "code"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / ".git").mkdir()
    for k, t in enumerate(DOCS[:6]):
        (root / "pkg" / f"m{k}.py").write_text(t, encoding="utf-8")
    (root / "README.md").write_text(DOCS[6], encoding="utf-8")
    (root / "pkg" / "__pycache__" / "m0.pyc").write_bytes(b"\0\1\2")
    (root / ".git" / "HEAD").write_text("ref")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    c = corpus_from_spec(f"dir:{root}", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    assert c.skip_reasons == {"binary": 2} and c.skipped == 2  # logo.png (NUL), latin1.txt (not UTF-8)
    want = [DOCS[6]] + DOCS[:6]  # README.md sorts before pkg/
    assert [bytes(_bytes_doc(c, d).astype(np.uint8)).decode() for d in range(len(c))] == want
    assert c.where(1) == str((root / "pkg" / "m0.py").resolve())
    py = corpus_from_spec(f"dir:{root}:.py", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    assert len(py) == 6 and py.skipped == 0


def test_bpe_tokens_decode_to_the_text(tmp_path):
    pytest.importorskip("tokenizers")
    tok = train_bpe(texts(200, seed=2), 400, tmp_path / "tok.json")
    assert 300 < tok.vocab <= 400  # fewer when the text runs out of pairs seen >= min_frequency times
    p = write_jsonl(tmp_path / "a.jsonl", DOCS)
    c = corpus_from_spec(f"jsonl:{p}", seed=0, vocab=512, tokenizer=tmp_path / "tok.json",
                         cache_dir=tmp_path / "cache")
    assert c.vocab == tok.vocab and int(max(c.tokens(d, 0, int(c.sizes[d]) - 1).max() for d in range(len(c)))) < c.vocab
    assert c.tokens_total < sum(len(t.encode()) for t in DOCS) * 0.8  # merges compress the text
    for d in range(len(c)):
        assert tok.decode(c.tokens(d, 0, int(c.sizes[d]) - 1)) == DOCS[d]
    with pytest.raises(TidalError, match="model's vocab is 300"):
        corpus_from_spec(f"jsonl:{p}", seed=0, vocab=300, tokenizer=tmp_path / "tok.json",
                         cache_dir=tmp_path / "cache")
    with pytest.raises(TidalError, match="tokenizer applies to"):
        corpus_from_spec("stdlib", seed=0, vocab=512, tokenizer=tmp_path / "tok.json")


def test_cache_hit_never_tokenizes_and_stale_cache_is_rebuilt(tmp_path, monkeypatch):
    p = write_jsonl(tmp_path / "a.jsonl", DOCS)
    spec, cache = f"jsonl:{p}", tmp_path / "cache"
    first = corpus_from_spec(spec, seed=0, vocab=256, cache_dir=cache)
    lengths = first.length_source().lengths(0, len(first))

    def no_build(*a, **k):
        raise AssertionError("tokenized although the cache is current")

    monkeypatch.setattr(rc, "build_index", no_build)
    again = corpus_from_spec(spec, seed=0, vocab=256, cache_dir=cache)
    assert again.cache_status == "hit" and again.prefix == first.prefix
    np.testing.assert_array_equal(again.length_source().lengths(0, len(again)), lengths)
    assert again.length_source().spec == first.length_source().spec
    monkeypatch.undo()

    write_jsonl(p, DOCS + ["one more document"])  # content (size) changed
    grown = corpus_from_spec(spec, seed=0, vocab=256, cache_dir=cache)
    assert grown.cache_status.startswith("rebuilt: a.jsonl changed") and len(grown) == len(DOCS) + 1
    assert grown.length_source().spec != first.length_source().spec  # a sampler state of the old data won't resume
    with pytest.raises(TidalError, match="does not match"):
        TokenBudgetSampler(grown.length_source(), 1000, 100).load_state_dict(
            TokenBudgetSampler(first.length_source(), 1000, 100).state_dict())

    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, new mtime
    assert corpus_from_spec(spec, seed=0, vocab=256, cache_dir=cache).cache_status.startswith("rebuilt")

    b = path_of(grown.prefix, ".bin")
    b.write_bytes(b.read_bytes()[:-3])  # truncated token file
    fixed = corpus_from_spec(spec, seed=0, vocab=256, cache_dir=cache)
    assert fixed.cache_status.startswith("rebuilt: unreadable index")
    _check_same_as(fixed, DOCS + ["one more document"])


def test_index_file_format(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", DOCS[:5])
    c = corpus_from_spec(f"jsonl:{p}", seed=0, vocab=256, cache_dir=tmp_path / "cache")
    idx = open_index(c.prefix)
    h = idx.header
    assert h["n_docs"] == 5 and h["dtype"] == "uint8" and h["tokens"] == int(idx.offsets[-1])
    assert h["fingerprint"]["tokenizer"] == "bytes"
    assert h["fingerprint"]["files"][0][:2] == ["a.jsonl", p.stat().st_size]
    raw = path_of(c.prefix, ".bin").read_bytes()
    assert raw == "".join(DOCS[:5]).encode("utf-8")  # .bin: documents concatenated
    assert idx.record_of.tolist() == [1, 2, 3, 4, 5] and json.loads(json.dumps(h)) == h
    path_of(c.prefix, ".idx").write_bytes(b"garbage" * 10)
    with pytest.raises(TidalError, match="not a tidal index"):
        open_index(c.prefix)


def test_concurrent_opens_build_once(tmp_path):
    """Ranks opening the same corpus at once: one builds under the lock, the others map its index."""
    import multiprocessing as mp

    p = write_jsonl(tmp_path / "a.jsonl", texts(300, seed=4))
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        res = pool.starmap(_open_status, [(str(p), str(tmp_path / "cache"))] * 3)
    assert sorted(s for s, _ in res) == ["built", "hit", "hit"]
    assert len({n for _, n in res}) == 1


def _open_status(p: str, cache: str) -> tuple[str, int]:
    c = corpus_from_spec(f"jsonl:{p}", seed=0, vocab=256, cache_dir=Path(cache))
    return c.cache_status, c.tokens_total


def test_optional_libraries_are_imported_lazily(tmp_path):
    """Without tokenizers / pyarrow / datasets: the CLI imports, byte-level JSONL works, the others say what to
    install."""
    import subprocess
    import sys

    p = write_jsonl(tmp_path / "a.jsonl", DOCS[:5])
    code = f"""
import sys
for m in ("tokenizers", "pyarrow", "pyarrow.parquet", "datasets"):
    sys.modules[m] = None  # import fails
import tidal.cli.main
from tidal.core import TidalError
from tidal.data import corpus_from_spec
c = corpus_from_spec("jsonl:{p}", seed=0, vocab=256, cache_dir="{tmp_path / 'cache'}")
assert len(c) == 5
for spec, kw in (("jsonl:{p}", {{"tokenizer": "{p}"}}), ("parquet:{p}", {{}}), ("hf:{p}", {{}})):
    try:
        corpus_from_spec(spec, seed=0, vocab=256, cache_dir="{tmp_path / 'cache'}", **kw)
    except TidalError as e:
        assert "pip install 'tidal[data]'" in str(e), e
    else:
        raise AssertionError(spec)
print("ok")
"""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
