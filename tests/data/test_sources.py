"""Length sources: determinism, statistics roughly as documented, file formats and malformed files."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.core import TidalError
from tidal.data import SYNTHETIC, length_source, load_lengths

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_is_seeded_and_random_access(name):
    a = length_source(f"synthetic:{name}", 3)
    b = length_source(f"synthetic:{name}", 3)
    c = length_source(f"synthetic:{name}", 4)
    x = a.lengths(65000, 2000)  # straddles a block boundary
    assert np.array_equal(x, b.lengths(65000, 2000))
    assert not np.array_equal(x, c.lengths(65000, 2000))
    assert a[65536] == x[536]
    assert x.dtype == np.int64 and x.min() >= 1
    it = iter(a)
    assert [next(it) for _ in range(3)] == [(i, int(v)) for i, v in enumerate(a.lengths(0, 3))]


@pytest.mark.parametrize("name,mean,p50", [("commoncrawl", 620, 260), ("github", 2700, 1000), ("flanv2", 247, 63)])
def test_synthetic_statistics_match_docs(name, mean, p50):
    x = length_source(f"synthetic:{name}", 0).lengths(0, 200_000)
    assert abs(x.mean() / mean - 1) < 0.1
    assert abs(np.median(x) / p50 - 1) < 0.1


def test_text_file_in_file_order(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("5\n 7 \n3\n")
    s = length_source(f"lengths:{f}", 0)
    assert len(s) == 3 and list(s) == [(0, 5), (1, 7), (2, 3)]


def test_npy_file(tmp_path):
    f = tmp_path / "l.npy"
    np.save(f, np.array([4, 1, 9], dtype=np.int32))
    assert load_lengths(f).tolist() == [4, 1, 9]


@pytest.mark.parametrize(
    "content,needle",
    [("5\nx\n", ":2:"), ("5\n0\n", ":2:"), ("-3\n", ":1:"), ("", "empty"), ("4\n\n5\n", ":2:"), ("1.5\n", ":1:")],
)
def test_malformed_text(tmp_path, content, needle):
    f = tmp_path / "bad.txt"
    f.write_text(content)
    with pytest.raises(TidalError) as e:
        length_source(f"lengths:{f}", 0)
    msg = str(e.value)
    assert needle in msg and str(f) in msg and "\n" not in msg


@pytest.mark.parametrize("arr", [np.array([1.0, 2.0]), np.array([[1, 2]]), np.array([], dtype=np.int64),
                                 np.array([3, 0]), np.array(["a"])])
def test_malformed_npy(tmp_path, arr):
    f = tmp_path / "bad.npy"
    np.save(f, arr)
    with pytest.raises(TidalError) as e:
        length_source(f"lengths:{f}", 0)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_missing_and_bad_specs(tmp_path):
    for spec in (f"lengths:{tmp_path / 'nope.txt'}", "synthetic:pile", "foo:bar", "synthetic", "lengths:"):
        with pytest.raises(TidalError):
            length_source(spec, 0)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"\x93NUMPYgarbage")
    with pytest.raises(TidalError, match="junk.npy"):
        length_source(f"lengths:{junk}", 0)


def _positive_int(s: str) -> bool:
    try:
        return int(s.strip()) > 0
    except ValueError:
        return False


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 10**6), st.text(max_size=4)), min_size=0, max_size=20))
def test_text_file_accepts_exactly_positive_ints(tmp_path_factory, items):
    f = tmp_path_factory.mktemp("p") / "l.txt"
    f.write_text("".join(f"{x}\n" for x in items))
    lines = f.read_text().splitlines()
    ok = bool(lines) and all(_positive_int(s) for s in lines)
    if ok:
        assert load_lengths(f).tolist() == [int(s) for s in lines]
    else:
        with pytest.raises(TidalError):
            load_lengths(f)


def test_wlb_llm_tail_as_documented():
    """synthetic:wlb-llm: commoncrawl's body and 0.2 % of documents in a Pareto(1) tail on [64K, 128K]: no document
    longer than WLB-LLM's 128K context (its Fig. 3), and the tail holds about 0.2 % of the documents."""
    x = length_source("synthetic:wlb-llm", 0).lengths(0, 400_000)
    assert x.max() <= 131072
    assert (x >= 65536).mean() == pytest.approx(0.002, rel=0.15)
    assert np.median(x) == pytest.approx(260, rel=0.1)
