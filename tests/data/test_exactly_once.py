"""Exactly once over a full epoch of a real (JSONL, tokenized, cached) corpus, through TokenBudgetSampler and
StepPlanner with WLB outlier-delay queues, interrupted and resumed 3 times through a JSON round trip of the planner
(sampler position, delay queues, in-flight sequences) and ledger state."""

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from realdata import texts, write_jsonl

from tidal.baselines.packings import PACKINGS
from tidal.core import TidalError
from tidal.core.cluster import get_cluster
from tidal.core.model import get_model
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.data import EpochLedger, TokenBudgetSampler, corpus_from_spec
from tidal.planner.stepper import PlanningOptions, StepPlanner, build_candidates

pytestmark = pytest.mark.unit

MAX_LEN, TPS, SEED = 2048, 8192, 7
STRATS = "tp2cp2+2*tp1+tp1pp2;4*tp2;tp4+tp2+2*tp1"
STOPS = (4, 11, 18)  # interrupt after these many steps


def _fresh(spec: str, cache: Path):
    """Everything a restarted job rebuilds: corpus (from its cached index), sampler, planner, ledger."""
    corpus = corpus_from_spec(spec, seed=0, vocab=256, cache_dir=cache)
    cm = AnalyticCostModel(get_model("llama2-7b"), get_cluster("a800x16"))
    cands = build_candidates(cm, STRATS, None, tokens_per_step=TPS, max_len=MAX_LEN, seed=SEED)
    sampler = TokenBudgetSampler(corpus.length_source(), TPS, MAX_LEN, seed=SEED)
    planner = StepPlanner(cm, cands, sampler, PlanningOptions(max_len=MAX_LEN, tokens_per_step=TPS, packing="wlb",
                                                              seed=SEED), packings=PACKINGS)
    ledger = EpochLedger(corpus.length_source().lengths(0, len(corpus)), spec)
    return corpus, planner, ledger


def _step(corpus, planner, ledger):
    ps = planner.next()
    if ps is None:
        return None
    trained, delayed = ledger.record_planned(ps)
    batch = hashlib.sha256(b"".join(corpus.tokens(d, s, n).tobytes() for d, s, n in trained)).hexdigest()
    return {"plan": ps.plan.to_dict(timings=False), "trained": trained, "delayed": delayed, "tokens": batch}


def _run(spec, cache, stops=()):
    job = _fresh(spec, cache)
    out, states = [], []
    while True:
        if len(out) in stops:  # checkpoint, drop everything, restart from the JSON
            state = json.dumps({"planner": job[1].state_dict(), "ledger": job[2].state_dict()})
            states.append(json.loads(state))
            job = _fresh(spec, cache)
            job[1].load_state_dict(json.loads(state)["planner"])
            job[2].load_state_dict(json.loads(state)["ledger"])
        rec = _step(*job)
        if rec is None:
            return out, job, states
        out.append(rec)


@pytest.fixture(scope="module")
def corpus_spec(tmp_path_factory):
    d = tmp_path_factory.mktemp("eo")
    p = write_jsonl(d / "docs.jsonl", texts(150, seed=5))
    return f"jsonl:{p}", d / "cache"


def test_full_epoch_exactly_once_with_three_resumes(corpus_spec):
    spec, cache = corpus_spec
    straight, (corpus, planner, ledger), _ = _run(spec, cache)
    resumed, (_, planner2, ledger2), states = _run(spec, cache, STOPS)
    assert len(states) == 3 and len(straight) > max(STOPS)
    assert all(s["planner"]["in_flight"] for s in states)  # every interruption had delayed sequences in flight
    assert resumed == straight  # plans, trained sequences and their tokens: identical after each resume

    # Every document's positions are tiled exactly once by the trained (doc_id, start, length), independently of the
    # ledger, and the trained tokens reassemble each document.
    lengths = corpus.length_source().lengths(0, len(corpus))
    pieces = defaultdict(list)
    for rec in resumed:
        for d, s, n in rec["trained"]:
            pieces[d].append((s, n))
    assert sorted(pieces) == list(range(len(corpus)))
    for d, ps in pieces.items():
        ps.sort()
        ends = np.cumsum([0] + [n for _, n in ps])
        assert [s for s, _ in ps] == ends[:-1].tolist() and ends[-1] == lengths[d], d
        toks = [corpus.tokens(d, s, n) for s, n in ps]
        np.testing.assert_array_equal(np.concatenate([t[:-1] for t in toks] + [toks[-1][-1:]]),
                                      corpus.tokens(d, 0, int(lengths[d])))

    # The counters prove it, and agree with the sampler's and across the interrupted and straight runs.
    c = ledger2.check_complete()
    assert c == ledger.check_complete()
    assert c["docs_trained"] == len(corpus) and c["tokens_trained"] == int(lengths.sum())
    assert c["seqs_trained"] == sum(len(r["trained"]) for r in resumed)
    assert c["steps"] == len(resumed) and c["pending_delayed"] == 0
    assert c["seqs_delayed"] > 0 and c["delay_steps"] >= c["seqs_delayed"]
    assert c["delay_steps"] == sum(len(r["delayed"]) for r in resumed)
    stats = planner2.long_doc_stats
    assert stats == planner.long_doc_stats
    assert stats["docs"] == len(corpus) and stats["tokens"] == c["tokens_trained"]
    assert c["docs_split"] == stats["split_docs"] > 0
    assert c["split_seqs"] == stats["split_docs"] + stats["split_extra_seqs"]


def test_ledger_rejects_repeats_and_reports_missing():
    led = EpochLedger([5, 3, 8])
    led.record([(0, 0, 5), (2, 0, 4)], delayed=[(1, 0, 3)])
    assert led.missing() == [1, 2] and not led.complete
    with pytest.raises(TidalError, match="document 0 trained twice"):
        led.record([(0, 0, 5)])
    with pytest.raises(TidalError, match=r"document 2 positions \[2, 4\) trained twice"):
        led.record([(2, 2, 3)])
    with pytest.raises(TidalError, match=r"\[6, 9\) outside document 2"):
        led.record([(2, 6, 3)])
    with pytest.raises(TidalError, match="document 3 not in 0..2"):
        led.record([(3, 0, 1)])
    with pytest.raises(TidalError, match="epoch incomplete: 2 of 3 documents"):
        led.check_complete()
    state = json.loads(json.dumps(led.state_dict()))
    again = EpochLedger([5, 3, 8])
    again.load_state_dict(state)
    for x in (led, again):
        x.record([(2, 4, 4), (1, 0, 3)])
        assert x.check_complete() == {"steps": 2, "seqs_trained": 4, "tokens_trained": 16, "docs_trained": 3,
                                      "docs_split": 1, "split_seqs": 2, "seqs_delayed": 1, "tokens_delayed": 3,
                                      "delay_steps": 1, "pending_delayed": 0}
    with pytest.raises(TidalError, match="state is for other documents"):
        EpochLedger([5, 3, 9]).load_state_dict(state)


def test_ledger_with_truncated_documents():
    led = EpochLedger([5, 30, 8], truncate_at=10)
    led.record([(0, 0, 5), (1, 0, 10), (2, 0, 8)])
    assert led.check_complete()["tokens_trained"] == 23
    with pytest.raises(TidalError, match=r"\[0, 11\) outside document 1 of 10 positions"):
        EpochLedger([5, 30], truncate_at=10).record([(1, 0, 11)])
