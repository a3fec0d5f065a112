import json

import pytest

from tidal.core import (
    MODEL_PRESETS,
    ParallelScheme,
    PipelinePlan,
    Plan,
    StepPlan,
    TidalError,
    format_strategy,
    get_cluster,
    get_model,
    parse_strategies,
    parse_strategy,
    place,
)

pytestmark = pytest.mark.unit


def test_presets_exist_and_are_consistent():
    for name in ["tiny", "small", "llama2-7b", "llama2-13b", "llama-32b", "llama3-8b", "llama3-70b"]:
        m = get_model(name)
        assert m.hidden % m.heads == 0 and m.heads % m.kv_heads == 0
    assert 6.6e9 < get_model("llama2-7b").num_params() < 6.8e9  # the published 6.74B
    assert 69e9 < get_model("llama3-70b").num_params() < 72e9
    with pytest.raises(TidalError, match="unknown model preset"):
        get_model("gpt5")
    assert set(MODEL_PRESETS) >= {"tiny", "small"}


@pytest.mark.parametrize("name,n", [("a800x8", 8), ("a800x1024", 1024), ("h100x16", 16), ("h800x16+h20x32", 48),
                                    ("cpux4", 4)])
def test_cluster_presets(name, n):
    c = get_cluster(name)
    assert c.num_devices == n
    assert sum(c.node_sizes()) == n


def test_mixed_cluster_types_and_links():
    c = get_cluster("h800x16+h20x32")
    assert c.device_type(15).name == "h800" and c.device_type(16).name == "h20"
    assert c.bandwidth(0, 1) == 400e9  # NVLink inside an H800 node
    assert c.bandwidth(16, 17) == 900e9
    assert c.bandwidth(0, 16) == 25e9  # across nodes: the per-GPU share of 200 GB/s per node (decision 76)
    with pytest.raises(TidalError):
        get_cluster("b300x8")


def test_strategy_syntax_round_trip():
    s = parse_strategy("tp4+tp2pp2+2*tp1pp2")
    assert [str(x) for x in s] == ["tp4pp1cp1", "tp2pp2cp1", "tp1pp2cp1", "tp1pp2cp1"]
    assert parse_strategy(format_strategy(s)) == s
    assert len(parse_strategies("tp8;4*tp2;tp2cp2+2*tp1pp2")) == 3
    assert parse_strategy("pp4[10,6,6,10]")[0].layer_split == (10, 6, 6, 10)
    for bad in ["tp", "tp2tp2", "x*tp2", "0*tp2", "tq2", ""]:
        with pytest.raises(TidalError):
            parse_strategies(bad)


def test_scheme_validation():
    m = get_model("llama3-8b")
    ParallelScheme(tp=8).validate(m)
    with pytest.raises(TidalError, match="does not divide"):
        ParallelScheme(tp=16).validate(m)
    with pytest.raises(TidalError, match="exceeds"):
        ParallelScheme(pp=64).validate(m)
    assert ParallelScheme(pp=3).stage_layers(32) == (11, 11, 10)


def test_placement_keeps_tp_inside_nodes_and_order():
    c = get_cluster("a800x16")
    st = place(parse_strategy("tp2pp2+tp8+2*tp1pp2"), c)
    assert [str(p.scheme) for p in st.pipelines] == ["tp2pp2cp1", "tp8pp1cp1", "tp1pp2cp1", "tp1pp2cp1"]
    for p in st.pipelines:
        for g in range(0, len(p.devices), p.scheme.tp):
            nodes = {c.node_of(d) for d in p.devices[g : g + p.scheme.tp]}
            assert len(nodes) == 1
    assert sorted(d for p in st.pipelines for d in p.devices) == list(range(16))
    with pytest.raises(TidalError, match="needs 32 devices"):
        place(parse_strategy("4*tp8"), c)


def test_tp_wider_than_a_node_spans_whole_nodes():
    c = get_cluster("a800x32")
    st = place(parse_strategy("2*tp16"), c)
    assert {c.node_of(d) for d in st.pipelines[0].devices} == {0, 1}


def test_plan_json_round_trip():
    pp = PipelinePlan(2, 1, 2, (0, 1, 2, 3), 32768, ((0, 2), (1,)), 1.5, ("per-doc", "per-seq"))
    step = StepPlan((10, 11, 12), (100, 5000, 7), 0, (pp,), (), 1.5, 1.4, 3.2)
    plan = Plan("llama2-7b", "a800x8", ("tp2cp2",), (step,), {"seed": 1})
    back = Plan.from_json(plan.to_json())
    assert back == plan
    assert json.loads(plan.to_json(timings=False))["steps"][0]["plan_ms"] == 0.0
    with pytest.raises(TidalError, match="not a Tidal plan"):
        Plan.from_json("{}")
    with pytest.raises(TidalError, match="malformed plan JSON"):
        Plan.from_json("{not json")
