"""`tidal profile` end to end on 2 gloo ranks (tiny model, a couple of lengths): rows measured on the real runtime,
a fitted model file that `--cost-model` loads with the measured coefficients and MaxLen, the CSV rows and the PNG."""

import json

import pytest

from tidal.cli.main import main
from tidal.core import ParallelScheme, get_cluster, get_model
from tidal.costmodel import load_cost_model, read_profile
from tidal.runtime.profiler import auto_schemes


@pytest.mark.distributed
def test_profile_two_ranks_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "tiny", "--cluster", "cpux2", "--schemes", "tp2", "--totals", "64,256",
                 "--mixes", "4", "--out", str(out), "--timeout", "120"]) == 0
    doc = json.loads(out.read_text())
    fit = doc["schemes"]["tp2pp1cp1"]
    assert fit["rows"] == 8 and fit["max_len"] > 1024
    act = doc["memory"]["activations"]["tp2pp1cp1"]
    assert act["source"] == "saved-tensors" and act["m1"] > 0  # activations grow with tokens
    rows = read_profile(out.with_suffix(".csv"))
    assert len(rows) == 8 and all(r.seconds > 0 for r in rows)
    assert {sum(r.lengths) for r in rows} == {64, 256}
    # more tokens, more time: the longest single document costs more than the shortest
    by = {r.lengths: r.seconds for r in rows}
    assert by[(256,)] > by[(64,)]
    spec, cluster = get_model("tiny"), get_cluster("cpux2")
    cm = load_cost_model(out, spec, cluster)
    k = cm.coeffs(ParallelScheme(2), cluster.device_type(0))
    assert (k.a, k.b, k.c) == (fit["a"], fit["b"], fit["c"])
    assert cm.max_len(ParallelScheme(2), cluster.device_type(0)) == fit["max_len"]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_auto_schemes_fit_the_cluster_and_the_model():
    got = {s.short() for s in auto_schemes(get_model("tiny"), 4)}
    assert got == {"tp1", "tp2", "tp4", "pp2", "pp4", "cp2", "cp4", "tp2pp2", "tp2cp2", "pp2cp2"}
    assert all(s.num_devices <= 2 for s in auto_schemes(get_model("tiny"), 2))


def test_profile_bad_input_is_refused_before_any_rank(tmp_path, capsys):
    assert main(["profile", "--cluster", "cpux2", "--schemes", "tp4", "--out", str(tmp_path / "p.json")]) == 2
    assert "needs 4 devices" in capsys.readouterr().err
    assert main(["profile", "--totals", "0,12", "--out", str(tmp_path / "p.json")]) == 2
    assert "--totals" in capsys.readouterr().err
    assert main(["profile", "--data", "stdlib", "--draws", "0", "--out", str(tmp_path / "p.json")]) == 2
    assert "--draws" in capsys.readouterr().err
    assert main(["profile", "--dtype", "fp16", "--out", str(tmp_path / "p.json")]) == 2
    assert "profile dtype must be one of auto" in capsys.readouterr().err


def test_corpus_compositions_draw_the_corpus_documents():
    """Each drawn micro-batch fills its total exactly with the corpus's (split) documents; one single-document
    micro-batch per total keeps the quadratic term identifiable; seeded."""
    from tidal.runtime.profile import corpus_compositions

    lengths = [5, 100, 3000, 40, 700]
    mbs = corpus_compositions(lengths, [256, 2048], per_total=3, seed=1, max_doc=1024)
    assert len(mbs) == 2 * (1 + 3)
    assert mbs[0] == [256] and mbs[4] == [1024, 1024]
    for mb, total in zip(mbs, [256] * 4 + [2048] * 4):
        assert sum(mb) == total and max(mb) <= 1024
    allowed = {5, 100, 40, 700, 1024}
    for mb in mbs[1:4] + mbs[5:]:
        assert sum(x not in allowed for x in mb) <= 1, mb  # only the document cut to fill the total may differ
    assert mbs == corpus_compositions(lengths, [256, 2048], per_total=3, seed=1, max_doc=1024)
    with pytest.raises(Exception, match="no non-empty document"):
        corpus_compositions([0, 0], [256])
