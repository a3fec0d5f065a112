"""`tidal tokenizer train` builds a byte-level BPE from local text; `tidal tokenizer index` builds and reuses the
cached index of a corpus with it."""

import json

import numpy as np
import pytest

from tidal.cli.main import main
from tidal.data import corpus_from_spec

pytestmark = pytest.mark.unit


def _jsonl(path, n):
    rng = np.random.default_rng(9)
    words = ("def", "return", "the", "token", "über", "世界", "(", ")", "\n", "42")
    docs = [" ".join(words[i] for i in rng.integers(0, len(words), 20 + int(rng.integers(0, 300)))) for _ in range(n)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    return path


def test_tokenizer_train_then_index(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    p = _jsonl(tmp_path / "a.jsonl", 120)
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.py").write_text("def f(x):\n    return x + 1\n" * 50)
    tok = tmp_path / "tok" / "tokenizer.json"
    assert main(["tokenizer", "train", "--input", f"jsonl:{p}", "--input", str(code), "--vocab", "320",
                 "--out", str(tok), "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tok}: byte-level BPE, vocab " in out and tok.is_file()
    args = ["tokenizer", "index", "--data", f"jsonl:{p}", "--tokenizer", str(tok), "--cache-dir",
            str(tmp_path / "cache")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "120 documents" in out and "(built, " in out
    assert main([*args, "--lengths-out", str(tmp_path / "len.npy")]) == 0
    assert "(hit, " in capsys.readouterr().out
    lengths = np.load(tmp_path / "len.npy")
    assert len(lengths) == 120 and lengths.min() >= 1
    assert main(["plan", "--data", f"lengths:{tmp_path / 'len.npy'}", "--model", "tiny", "--cluster", "a800x8",
                 "--max-len", "512", "--tokens-per-step", "2048", "--steps", "2", "--strategies", "8*tp1",
                 "--quiet"]) == 0
    c = corpus_from_spec(f"jsonl:{p}", seed=0, vocab=320, tokenizer=tok, cache_dir=tmp_path / "cache")
    assert c.cache_status == "hit" and len(c) == 120 and c.vocab <= 320


def test_tokenizer_errors_exit_2(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    assert main(["tokenizer", "train", "--input", str(tmp_path / "none.txt"), "--vocab", "300",
                 "--out", str(tmp_path / "t.json")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "a.txt").write_text("hello world " * 100)
    assert main(["tokenizer", "train", "--input", str(tmp_path / "a.txt"), "--vocab", "100",
                 "--out", str(tmp_path / "t.json")]) == 2
    assert "needs vocab >= 257" in capsys.readouterr().err
    assert main(["tokenizer", "train", "--input", str(tmp_path / "a.txt"), "--vocab", "300", "--min-frequency", "-1",
                 "--out", str(tmp_path / "t.json")]) == 2  # the tokenizers library would raise an OverflowError
    assert "min_frequency must be >= 0, got -1" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["tokenizer", "index", "--data", f"dir:{tmp_path}", "--tokenizer", str(bad),
                 "--cache-dir", str(tmp_path / "cache")]) == 2
    assert f"tokenizer file {bad} does not load" in capsys.readouterr().err
