"""Pure checks of the pipeline schedules and stage splitting (no process group)."""

import dataclasses

import pytest

from tidal.core import TidalError, get_model
from tidal.models import Llama
from tidal.runtime.pp import schedule_1f1b, schedule_gpipe, split_stage, stage_layer_range

pytestmark = pytest.mark.unit


def _in_flight(actions):
    live, peak = set(), 0
    for kind, i in actions:
        if kind == "F":
            live.add(i)
        else:
            assert i in live, "backward before forward"
            live.remove(i)
        peak = max(peak, len(live))
    assert not live
    return peak


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_schedules(pp, m):
    for stage in range(pp):
        a = schedule_1f1b(m, pp, stage)
        g = schedule_gpipe(m, pp, stage)
        assert sorted(a) == sorted(g) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert _in_flight(a) == min(pp - stage, m)
        assert _in_flight(g) == m
        assert [i for k, i in a if k == "B"] == [i for k, i in g if k == "B"] == list(range(m))


def test_uneven_split():
    spec = dataclasses.replace(get_model("tiny"), layers=6)
    split = (2, 1, 1, 2)
    assert [list(stage_layer_range(split, s)) for s in range(4)] == [[0, 1], [2], [3], [4, 5]]
    m = split_stage(Llama(spec, "reference"), split, 3)
    assert list(m.layers) == ["4", "5"] and m.tok_embeddings is None and m.output is not None
    m = split_stage(Llama(spec, "reference"), split, 0)
    assert list(m.layers) == ["0", "1"] and m.norm is None and m.output is None
    with pytest.raises(TidalError):
        split_stage(Llama(spec, "reference"), (3, 2), 0)
    with pytest.raises(TidalError):
        schedule_1f1b(3, 2, 2)
