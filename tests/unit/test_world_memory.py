"""`[world] memory_gib` (decision 93): a per-device memory budget the planner plans for."""

import pytest

from tidal.core.cluster import get_cluster, with_memory
from tidal.core.errors import TidalError
from tidal.core.model import get_model
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.loader import load_cost_model
from tidal.costmodel.memory import executor_memory
from tidal.runtime.config import WorldConfig

pytestmark = pytest.mark.unit


def test_with_memory_sets_every_device():
    c = with_memory(get_cluster("a800x8+h20x8"), 2**30)
    assert [g.device.memory_bytes for g in c.groups] == [2**30, 2**30]
    assert c.num_devices == 16 and c.groups[1].device.name == "h20"
    with pytest.raises(TidalError):
        with_memory(c, 0)


def test_world_memory_gib_checked():
    assert WorldConfig("cpux2", 0.5).memory_gib == 0.5 and WorldConfig().memory_gib == 0.0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(TidalError, match="memory_gib"):
            WorldConfig("cpux2", bad)


def test_smaller_budget_smaller_maxlen():
    spec, cl = get_model("tiny"), get_cluster("cpux2")
    tp1 = ParallelScheme(1, 1, 1)
    small, big = (with_memory(cl, g * 2**30) for g in (0.1, 0.2))
    cm = AnalyticCostModel(spec, cl)
    assert cm.max_len(tp1, small.groups[0].device) < cm.max_len(tp1, big.groups[0].device)


def test_profile_fallback_maxlen_uses_given_memory(tmp_path):
    """A profile CSV has no MaxLen: unprofiled (and profiled) schemes take the analytic memory model's, under the
    memory config passed in (the training job's dtypes), not the default one."""
    from tidal.runtime.profile import write_profile

    spec, cl = get_model("tiny"), with_memory(get_cluster("cpux2"), 0.2 * 2**30)
    path = tmp_path / "p.csv"
    write_profile(path, spec, "cpu", "tp1pp1cp1", [((256,), 0.01), ((512,), 0.02), ((1024,), 0.045)])
    fp32 = executor_memory("float32", "float32")  # what a CPU training job holds (runtime/train.train_memory)
    dev = cl.groups[0].device
    for sch in (ParallelScheme(1, 1, 1), ParallelScheme(2, 1, 1)):
        got = load_cost_model(path, spec, cl, memory=fp32).max_len(sch, dev)
        assert got == AnalyticCostModel(spec, cl, memory=fp32).max_len(sch, dev)
        assert got < load_cost_model(path, spec, cl).max_len(sch, dev)
