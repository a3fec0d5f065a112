"""Token corpora: deterministic ids and tokens, slices, skipped documents, specs, and sampler chunks that tile."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.core import TidalError
from tidal.data import RandomTokenCorpus, StdlibCorpus, TokenBudgetSampler, corpus_from_spec
from tidal.data.corpus import stdlib_root

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def stdlib():
    return StdlibCorpus()


def _fake_tree(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg" / "tests").mkdir(parents=True)
    (root / "site-packages").mkdir()
    (root / "b.py").write_bytes(b"print('b')\n")
    (root / "a.py").write_bytes(b"x")  # 1 byte: cannot make a sequence
    (root / "empty.py").write_bytes(b"")
    (root / "pkg" / "mod.py").write_bytes("s = 'h\u00e9llo'\n".encode())
    (root / "pkg" / "tests" / "test_mod.py").write_bytes(b"assert True\n")
    (root / "site-packages" / "third.py").write_bytes(b"import os\n")
    (root / "notes.txt").write_bytes(b"not python")
    return root


def test_index_order_skips_and_tokens_on_a_known_tree(tmp_path):
    root = _fake_tree(tmp_path)
    c = StdlibCorpus(root=root)
    assert c.paths == ("b.py", "pkg/mod.py")
    assert c.skipped == 2  # a.py (1 byte) and empty.py, counted, not silently dropped
    src = c.length_source()
    assert src.size == 2 and src.lengths(0, 2).tolist() == [10, len("s = 'h\u00e9llo'\n".encode()) - 1]
    assert c.tokens(0, 0, 10).tolist() == list(b"print('b')\n")
    assert c.tokens(1, 5, 3).tolist() == list("s = 'h\u00e9llo'\n".encode()[5:9])  # UTF-8 bytes
    t = StdlibCorpus(root=root, include_tests=True)
    assert t.paths == ("b.py", "pkg/mod.py", "pkg/tests/test_mod.py") and t.spec == "stdlib:tests"
    m = StdlibCorpus(root=root, include_tests=True, min_len=12, max_docs=1)
    assert m.paths == ("pkg/mod.py",) and m.skipped == 3


def test_stdlib_corpus_is_real_long_tailed_and_deterministic(stdlib):
    assert len(stdlib) > 300 and stdlib.vocab == 256
    assert not any(p.split("/")[0] in ("test", "site-packages") for p in stdlib.paths)
    lens = stdlib.length_source().lengths(0, len(stdlib))
    assert (lens >= 1).all()
    assert lens.max() > 20 * np.median(lens)  # long tail
    with_tests = StdlibCorpus(include_tests=True)
    assert len(with_tests) > len(stdlib)
    code = ("from tidal.data import StdlibCorpus; import hashlib; c = StdlibCorpus(); h = hashlib.sha256(repr(("
            "c.paths, c.sizes.tolist(), c.tokens(7, 3, 50).tolist())).encode()); print(h.hexdigest())")
    mine = hashlib.sha256(repr((stdlib.paths, stdlib.sizes.tolist(), stdlib.tokens(7, 3, 50).tolist())).encode())
    env = {**os.environ, "PYTHONPATH": str(Path(tidal.__file__).resolve().parents[1])}  # this checkout's tidal
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                           env=env)
    assert other.stdout.strip() == mine.hexdigest()


def test_stdlib_tokens_are_file_bytes(stdlib):
    for d in (0, len(stdlib) // 2, len(stdlib) - 1):
        raw = (stdlib_root() / stdlib.paths[d]).read_bytes()
        n = len(raw) - 1
        assert stdlib.tokens(d, 0, n).tolist() == list(raw)
        assert stdlib.tokens(d, n // 3, n - n // 3).tolist() == list(raw[n // 3:])
        assert stdlib.tokens(d, 0, n).dtype == np.int64
    with pytest.raises(TidalError, match="past the"):
        stdlib.tokens(0, 1, int(stdlib.sizes[0]) - 1)
    with pytest.raises(TidalError, match="not in 0.."):
        stdlib.tokens(len(stdlib), 0, 1)
    with pytest.raises(TidalError, match="bad slice"):
        stdlib.tokens(0, 0, 0)


def test_random_corpus_is_seeded_per_document(tmp_path):
    a = RandomTokenCorpus("synthetic:github", seed=4, vocab=1000)
    b = RandomTokenCorpus("synthetic:github", seed=4, vocab=1000)
    n = a.length_source()[3]
    assert n == b.length_source()[3]
    full = a.tokens(3, 0, n)
    assert len(full) == n + 1 and full.min() >= 0 and full.max() < 1000
    assert np.array_equal(full, b.tokens(3, 0, n))
    assert np.array_equal(a.tokens(3, n // 2, n - n // 2), full[n // 2:])
    assert not np.array_equal(a.tokens(4, 0, 8), a.tokens(5, 0, 8))
    assert not np.array_equal(RandomTokenCorpus("synthetic:github", seed=5, vocab=1000).tokens(3, 0, 8), full[:9])
    f = tmp_path / "l.txt"
    f.write_text("5\n1\n9\n")
    c = corpus_from_spec(f"random:lengths:{f}", seed=0, vocab=50)
    assert c.length_source().lengths(0, 3).tolist() == [5, 1, 9] and c.skipped == 0
    assert len(c.tokens(1, 0, 1)) == 2
    with pytest.raises(TidalError, match="past the"):
        c.tokens(0, 1, 5)
    with pytest.raises(TidalError, match="not in 0..2"):
        c.tokens(3, 0, 1)


@pytest.mark.parametrize("spec,msg", [
    ("wiki", "bad corpus spec"), ("stdlib:foo", "bad corpus spec"), ("random:", "bad corpus spec"),
    ("random:synthetic:nope", "unknown synthetic source"), ("random:lengths:/no/such/file", "does not exist"),
])
def test_bad_specs_are_one_line_errors(spec, msg):
    with pytest.raises(TidalError, match=msg) as e:
        corpus_from_spec(spec, seed=0, vocab=256)
    assert "\n" not in str(e.value)


def test_spec_kinds_and_vocab_checks():
    assert corpus_from_spec("stdlib:tests", seed=0, vocab=256).spec == "stdlib:tests"
    assert corpus_from_spec("random:synthetic:flanv2", seed=1, vocab=300).vocab == 300
    with pytest.raises(TidalError, match="byte-level"):
        corpus_from_spec("stdlib", seed=0, vocab=100)
    with pytest.raises(TidalError, match="vocab must be >= 2"):
        corpus_from_spec("random:synthetic:github", seed=0, vocab=1)
    with pytest.raises(TidalError, match="min_len"):
        StdlibCorpus(min_len=1)


@pytest.mark.parametrize("which", ["stdlib", "random"])
def test_sampler_chunks_fetch_and_tile_documents(stdlib, which):
    corpus = stdlib if which == "stdlib" else RandomTokenCorpus("synthetic:github", seed=2, vocab=512)
    max_len = 4096
    sampler = TokenBudgetSampler(corpus.length_source(), 40000, max_len, seed=3)
    pieces: dict[int, list[tuple[int, np.ndarray]]] = {}
    for st in sampler.steps(25):
        for d, s, ln in zip(st.doc_ids, st.starts, st.lengths):
            toks = corpus.tokens(d, s, ln)
            assert len(toks) == ln + 1 and ln <= max_len
            pieces.setdefault(d, []).append((s, toks))
    split = [d for d, ps in pieces.items() if len(ps) > 1]
    assert split, "expected some documents longer than max_len"
    checked = 0
    for d in split:
        n_tokens = corpus.length_source()[d] + 1
        ps = sorted(pieces[d], key=lambda x: x[0])
        if ps[0][0] != 0 or ps[-1][0] + len(ps[-1][1]) != n_tokens:
            continue  # a document cut by the end of the 25 steps
        # inputs tile positions [0, n-1) exactly once; labels [1, n); the last label closes the document
        joined = np.concatenate([t[:-1] for _, t in ps] + [ps[-1][1][-1:]])
        assert np.array_equal(joined, corpus.tokens(d, 0, n_tokens - 1))
        starts = [s for s, _ in ps]
        assert starts == [0] + list(np.cumsum([len(t) - 1 for _, t in ps[:-1]]))
        checked += 1
    assert checked >= 1
