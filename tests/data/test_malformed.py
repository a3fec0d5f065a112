"""Malformed input: an error naming the file and line (or row), or a documented, counted skip. One test per case."""

import json
import os

import pytest
from realdata import texts, write_jsonl

from tidal.core import TidalError
from tidal.data import corpus_from_spec
from tidal.data.tokenize import load_tokenizer

pytestmark = pytest.mark.unit

DOCS = texts(6, seed=3)


def _open(spec, tmp_path, **kw):
    return corpus_from_spec(spec, seed=0, vocab=1 << 16, cache_dir=tmp_path / "cache", **kw)


def _lines(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


def test_bad_json_line_names_file_and_line(tmp_path):
    p = _lines(tmp_path / "a.jsonl", [json.dumps({"text": DOCS[0]}), json.dumps({"text": DOCS[1]}),
                                      '{"text": "unterminated', json.dumps({"text": DOCS[2]})])
    with pytest.raises(TidalError, match=rf"^{p.resolve()}:3: bad JSON: Unterminated string starting at \(column 10\)"):
        _open(f"jsonl:{p}", tmp_path)
    q = _lines(tmp_path / "b.jsonl", [json.dumps({"text": DOCS[0]}), json.dumps([1, 2])])
    with pytest.raises(TidalError, match=rf"^{q.resolve()}:2: expected a JSON object, got list"):
        _open(f"jsonl:{q}", tmp_path)
    r = tmp_path / "c.jsonl"
    r.write_bytes(json.dumps({"text": "ok"}).encode() + b"\n" + b'{"text": "caf\xe9"}\n')
    with pytest.raises(TidalError, match=rf"^{r.resolve()}:2: not valid UTF-8"):
        _open(f"jsonl:{r}", tmp_path)
    assert not list((tmp_path / "cache").glob("*.idx"))  # nothing half-built is left as an index


def test_missing_field_names_file_and_line(tmp_path):
    p = _lines(tmp_path / "a.jsonl", [json.dumps({"text": DOCS[0]}), json.dumps({"body": DOCS[1], "id": 1})])
    with pytest.raises(TidalError, match=rf"^{p.resolve()}:2: missing field 'text' \(fields: body, id\)"):
        _open(f"jsonl:{p}", tmp_path)
    q = _lines(tmp_path / "b.jsonl", [json.dumps({"text": DOCS[0]}), json.dumps({"text": None})])
    with pytest.raises(TidalError, match=rf"^{q.resolve()}:2: field 'text' is NoneType, expected a string"):
        _open(f"jsonl:{q}", tmp_path)
    with pytest.raises(TidalError, match=rf"^{p.resolve()}:1: missing field 'body'"):
        _open(f"jsonl:{p}:body", tmp_path)


def test_missing_column_parquet_and_dataset(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"body": DOCS}), p)
    with pytest.raises(TidalError, match=rf"^{p.resolve()}: missing column 'text' \(columns: body\)"):
        _open(f"parquet:{p}", tmp_path)
    q = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [DOCS[0], None, DOCS[1]]}), q)
    with pytest.raises(TidalError, match=rf"^{q.resolve()} row 1: column 'text' is null"):
        _open(f"parquet:{q}", tmp_path)
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": DOCS}).save_to_disk(str(saved))
    with pytest.raises(TidalError, match=r"missing field 'text' \(fields: body\)"):
        _open(f"hf:{saved}", tmp_path)


def test_unreadable_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TidalError, match=rf"{missing} does not exist"):
        _open(f"jsonl:{missing}", tmp_path)
    root = tmp_path / "code"
    root.mkdir()
    (root / "a.py").write_text(DOCS[0])
    os.symlink(tmp_path / "gone.py", root / "b.py")  # dangling link: listed, cannot be read
    with pytest.raises(TidalError, match=rf"cannot read {root.resolve() / 'b.py'}: No such file"):
        _open(f"dir:{root}", tmp_path)
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"this is not parquet at all")
    pytest.importorskip("pyarrow")
    with pytest.raises(TidalError, match=rf"^{bad.resolve()}: not a readable Parquet file"):
        _open(f"parquet:{bad}", tmp_path)
    if os.geteuid() != 0:  # root reads mode-000 files anyway
        locked = write_jsonl(tmp_path / "locked.jsonl", DOCS)
        locked.chmod(0)
        with pytest.raises(TidalError, match=rf"cannot read {locked.resolve()}: Permission denied"):
            _open(f"jsonl:{locked}", tmp_path)


def test_empty_documents_are_counted_skips(tmp_path):
    p = _lines(tmp_path / "a.jsonl", [json.dumps({"text": DOCS[0]}), json.dumps({"text": ""}), "",
                                      json.dumps({"text": "x"}), json.dumps({"text": DOCS[1]}), "   "])
    c = _open(f"jsonl:{p}", tmp_path)
    assert len(c) == 2 and c.skipped == 4
    assert c.skip_reasons == {"blank_line": 2, "empty": 1, "short": 1}  # "x" is 1 token: no sequence to train
    assert [c.where(d) for d in range(2)] == [f"{p.resolve()}:1", f"{p.resolve()}:5"]
    root = tmp_path / "code"
    root.mkdir()
    (root / "empty.py").write_text("")
    (root / "a.py").write_text(DOCS[2])
    d = _open(f"dir:{root}", tmp_path)
    assert len(d) == 1 and d.skip_reasons == {"empty": 1}
    only = _lines(tmp_path / "only.jsonl", [json.dumps({"text": ""}), ""])
    with pytest.raises(TidalError, match=r"no document of >= 2 tokens \(skipped: \{'blank_line': 1, 'empty': 1\}\)"):
        _open(f"jsonl:{only}", tmp_path)


def test_tokenizer_file_that_does_not_load(tmp_path):
    pytest.importorskip("tokenizers")
    p = write_jsonl(tmp_path / "a.jsonl", DOCS)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    with pytest.raises(TidalError, match=rf"^tokenizer file {bad} does not load: "):
        _open(f"jsonl:{p}", tmp_path, tokenizer=bad)
    bad.write_text("{ not json")
    with pytest.raises(TidalError, match=rf"^tokenizer file {bad} does not load: "):
        load_tokenizer(bad)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TidalError, match=rf"^tokenizer file {bad} does not load: "):
        load_tokenizer(bad)
    with pytest.raises(TidalError, match=rf"^tokenizer file {tmp_path / 'none.json'} cannot be read: No such file"):
        load_tokenizer(tmp_path / "none.json")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.idx"))
