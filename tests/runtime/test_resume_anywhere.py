"""Resume under another strategy list or world size (issue 25): weights and moments bit-equal after load, the same
documents every step as the uninterrupted stream, none lost or repeated (the exactly-once ledger's counters).

Seven steps, each segment resuming from the previous one's checkpoint: on 4 ranks 4*tp1 -> tp2+2*tp1 (homogeneous
-> heterogeneous) -> tp1cp2+tp2 (no CP -> CP) -> 2*tp2 (CP -> no CP, heterogeneous -> homogeneous); on 3 ranks
tp2+tp1 (4 -> 3 ranks); on 4 ranks 2*tp1pp2 (3 -> 4 ranks, no PP -> PP) -> tp2+2*tp1 (PP -> no PP). Tolerance:
exact (float64 masters; a checkpoint stores and reloads every value unchanged, whatever world size reads it).
"""

import pytest

from tidal.runtime.launch import run_distributed
from tidal.runtime.train import make_ledger, make_planner, open_corpus, prepare

from _resume_cases import chain_worker, config  # isort: skip

pytestmark = [pytest.mark.reliability, pytest.mark.distributed]

STEPS = 7


def _uninterrupted():
    """The documents of every step and the ledger's counters, as one uninterrupted run plans them (with
    hydraulis packing every document of a step is trained that step, whatever the strategy)."""
    job = prepare(config(4, "4*tp1", STEPS, "", False), 4)
    planner, corpus = make_planner(job)
    ledger = make_ledger(job, open_corpus(job.config, job.spec))
    steps, counters = [], []
    for _ in range(STEPS):
        ps = planner.next()
        ledger.record_planned(ps)
        steps.append(sorted(list(d) for d in ps.docs))
        counters.append(ledger.counters())
    return steps, counters


def test_resume_under_five_strategy_pairs_and_4_3_4_ranks(tmp_path):
    d = str(tmp_path / "ckpt")
    first = run_distributed(chain_worker, 4, [("4*tp1", 1), ("tp2+2*tp1", 2), ("tp1cp2+tp2", 3), ("2*tp2", 4)],
                            d, None, timeout_s=900)[0]
    second = run_distributed(chain_worker, 3, [("tp2+tp1", 5)], d, first["state"], timeout_s=600)[0]
    third = run_distributed(chain_worker, 4, [("2*tp1pp2", 6), ("tp2+2*tp1", 7)], d, second["state"],
                            timeout_s=600)[0]
    assert first["problems"] + second["problems"] + third["problems"] == []  # bit-equal after every load
    rows = first["rows"] + second["rows"] + third["rows"]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert [r["strategy"].replace(" ", "") for r in rows] == [
        "4*tp1", "tp2+2*tp1", "cp2+tp2", "2*tp2", "tp2+tp1", "2*pp2", "tp2+2*tp1"]
    want_docs, want_counters = _uninterrupted()
    assert [sorted(r["docs_run"]) for r in rows] == want_docs
    trained = [tuple(x) for r in rows for x in r["docs_run"]]
    assert len(trained) == len(set(trained))  # nothing trained twice
    assert [r["data"] for r in rows] == want_counters  # exactly-once counters, step by step
