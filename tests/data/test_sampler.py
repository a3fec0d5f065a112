"""Token-budget sampler: conservation (nothing lost or duplicated), long-document policy, budget, resume."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.core import TidalError
from tidal.data import SamplerState, TokenBudgetSampler, length_source, sample_steps, split_sizes

pytestmark = pytest.mark.unit


def _file_source(tmp_path, lengths):
    f = tmp_path / "l.txt"
    f.write_text("".join(f"{x}\n" for x in lengths))
    return length_source(f"lengths:{f}", 0)


lengths_st = st.lists(st.integers(1, 300), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, budget=st.integers(1, 700), max_len=st.integers(1, 200), seed=st.integers(0, 2**31),
       shuffle=st.booleans())
def test_split_conserves_every_token(tmp_path_factory, lengths, budget, max_len, seed, shuffle):
    src = _file_source(tmp_path_factory.mktemp("s"), lengths)
    sampler = TokenBudgetSampler(src, budget, max_len, seed=seed, shuffle=shuffle)
    steps = list(sampler.steps())
    ids = [i for s in steps for i in s.seq_ids]
    assert ids == list(range(len(ids)))  # running, unique, no gaps
    per_doc: dict[int, list[tuple[int, int]]] = {}
    for s in steps:
        assert len(s.seq_ids) >= 1
        assert s.tokens <= budget or len(s.lengths) == 1
        for ln, d, c in zip(s.lengths, s.doc_ids, s.chunks):
            assert 1 <= ln <= max_len
            per_doc.setdefault(d, []).append((c, ln))
    assert sorted(per_doc) == list(range(len(lengths)))
    for d, parts in per_doc.items():
        assert [c for c, _ in parts] == list(range(len(parts)))  # consecutive chunks, in order
        assert [ln for _, ln in parts] == split_sizes(lengths[d], max_len)
    total = sampler.state.stats
    assert total.tokens == sum(lengths) and total.docs == len(lengths) and total.truncated_tokens == 0
    assert total.split_docs == sum(x > max_len for x in lengths)
    assert total.split_extra_seqs == len(ids) - len(lengths)
    if not shuffle:
        assert [d for s in steps for d, c in zip(s.doc_ids, s.chunks) if c == 0] == list(range(len(lengths)))


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_st, budget=st.integers(1, 700), max_len=st.integers(1, 200))
def test_truncate_counts_cut_tokens(tmp_path_factory, lengths, budget, max_len):
    src = _file_source(tmp_path_factory.mktemp("t"), lengths)
    sampler = TokenBudgetSampler(src, budget, max_len, long_docs="truncate", seed=1)
    steps = list(sampler.steps())
    emitted = sum(s.tokens for s in steps)
    st_ = sampler.state.stats
    assert emitted + st_.truncated_tokens == sum(lengths)
    assert st_.truncated_docs == sum(x > max_len for x in lengths)
    assert sum(len(s.seq_ids) for s in steps) == len(lengths)
    assert sum((s.stats for s in steps[1:]), steps[0].stats) == st_


def test_error_policy_names_the_document(tmp_path):
    src = _file_source(tmp_path, [5, 500, 3])
    with pytest.raises(TidalError, match="500 tokens > max_len 100"):
        list(TokenBudgetSampler(src, 1000, 100, long_docs="error", shuffle=False).steps())


def test_bad_config():
    src = length_source("synthetic:commoncrawl", 0)
    for kw in ({"tokens_per_step": 0, "max_len": 10}, {"tokens_per_step": 10, "max_len": 0},
               {"tokens_per_step": 10, "max_len": 10, "long_docs": "drop"},
               {"tokens_per_step": 10, "max_len": 10, "seed": -1}):
        with pytest.raises(TidalError):
            TokenBudgetSampler(src, **kw)
    with pytest.raises(TidalError):
        list(TokenBudgetSampler(src, 10, 10).steps())  # infinite source needs a count
    with pytest.raises(TidalError, match="seed must be >= 0"):  # numpy's own error would be a traceback
        length_source("synthetic:commoncrawl", -1)


@settings(max_examples=30, deadline=None)
@given(spec=st.sampled_from(["synthetic:commoncrawl", "synthetic:github", "synthetic:flanv2", "file"]),
       seed=st.integers(0, 1000), k=st.integers(0, 6), cycle=st.booleans())
def test_resume_reproduces_stream(tmp_path_factory, spec, seed, k, cycle):
    if spec == "file":
        f = tmp_path_factory.mktemp("r") / "l.npy"
        np.save(f, np.random.default_rng(seed).integers(1, 40_000, size=97))
        spec = f"lengths:{f}"
    kw = dict(seed=seed, tokens_per_step=100_000, max_len=16_384, cycle=cycle)
    full, _ = sample_steps(spec, steps=k + 4, **kw)
    head, state = sample_steps(spec, steps=k, **kw)
    state2 = SamplerState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert state2 == state
    tail, _ = sample_steps(spec, steps=4, state=state2, **kw)
    assert head + tail == full


def test_file_end_and_cycle(tmp_path):
    src = _file_source(tmp_path, [10] * 25)
    s = TokenBudgetSampler(src, 100, 50, seed=0)
    steps = list(s.steps())
    assert [st_.tokens for st_ in steps] == [100, 100, 50] and s.next_step() is None
    c = TokenBudgetSampler(src, 100, 50, seed=0, cycle=True)
    got = list(c.steps(5))
    assert [st_.tokens for st_ in got] == [100] * 5 and c.state.epoch == 1
    assert sorted([d for st_ in got[:2] for d in st_.doc_ids] + list(got[2].doc_ids[:5])) == list(range(25))


def test_state_mismatch_rejected():
    _, state = sample_steps("synthetic:github", seed=1, tokens_per_step=1000, max_len=100, steps=2)
    with pytest.raises(TidalError, match="does not match"):
        sample_steps("synthetic:github", seed=2, tokens_per_step=1000, max_len=100, steps=2, state=state)
    with pytest.raises(TidalError):
        SamplerState.from_dict({"source": "x"})


@pytest.mark.parametrize("policy", ["split", "truncate"])
def test_starts_are_offsets_within_the_document(tmp_path, policy):
    lens = [25, 3, 61, 10, 40]
    src = _file_source(tmp_path, lens)
    steps = list(TokenBudgetSampler(src, 30, 20, long_docs=policy, seed=1).steps())
    got: dict[int, list[tuple[int, int, int]]] = {}
    for s in steps:
        assert len(s.starts) == len(s.seq_ids)
        for d, c, st_, ln in zip(s.doc_ids, s.chunks, s.starts, s.lengths):
            got.setdefault(d, []).append((c, st_, ln))
    for d, pieces in got.items():
        if policy == "truncate":
            assert pieces == [(0, 0, min(lens[d], 20))]
            continue
        assert [c for c, _, _ in pieces] == list(range(len(pieces)))
        assert [st_ for _, st_, _ in pieces] == [sum(split_sizes(lens[d], 20)[:c]) for c in range(len(pieces))]
        assert pieces[-1][1] + pieces[-1][2] == lens[d]


def test_state_dict_round_trip_resumes_exactly():
    src = length_source("synthetic:github", 5)
    a = TokenBudgetSampler(src, 50000, 8192, seed=5)
    ref = list(a.steps(6))
    b = TokenBudgetSampler(src, 50000, 8192, seed=5)
    first = list(b.steps(2))
    c = TokenBudgetSampler(src, 50000, 8192, seed=5)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    assert first + list(c.steps(4)) == ref
    assert c.long_doc_stats == a.long_doc_stats and c.long_doc_stats["docs"] > 0
    with pytest.raises(TidalError, match="does not match"):
        TokenBudgetSampler(src, 50000, 4096, seed=5).load_state_dict(b.state_dict())
