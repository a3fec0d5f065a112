"""Process-group helpers that need no process group: layout vs group order, and the reduce-scatter capability table."""

import pytest
import torch

from tidal.core import ParallelScheme
from tidal.core.strategy import Pipeline
from tidal.runtime.groups import GroupCache, native_reduce_scatter, pipeline_group_ranks, slot_in_group, stage_pairs

pytestmark = pytest.mark.unit


def test_slot_is_position_in_ascending_rank_order():
    assert [slot_in_group((8, 0), r) for r in (8, 0)] == [1, 0]
    assert [slot_in_group((3, 1, 2), r) for r in (3, 1, 2)] == [2, 0, 1]


def test_pipeline_groups_follow_the_layout():
    p = Pipeline(ParallelScheme(tp=2, pp=2, cp=2), (7, 6, 5, 4, 3, 2, 1, 0))
    groups = pipeline_group_ranks(p)
    assert (7, 6) in groups and (7, 5) in groups and (7, 3) in groups  # TP, CP, tied first/last pair
    assert tuple(p.devices) in groups and all(len(g) > 1 for g in groups)


def test_adjacent_stage_pairs_get_groups():
    """One p2p group per (stage s, stage s + 1) pair at each (cp, tp) coordinate, listed with the pipeline's groups."""
    p = Pipeline(ParallelScheme(tp=2, pp=3), (10, 11, 12, 13, 14, 15))
    assert stage_pairs(p) == [(10, 12), (11, 13), (12, 14), (13, 15)]
    assert all(pair in pipeline_group_ranks(p) for pair in stage_pairs(p))
    assert stage_pairs(Pipeline(ParallelScheme(tp=2), (0, 1))) == []


def test_reduce_scatter_capability_table():
    assert native_reduce_scatter("nccl") and native_reduce_scatter("NCCL")
    assert not native_reduce_scatter("fake")
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert native_reduce_scatter("gloo") == ((major, minor) >= (2, 8))


def test_group_cache_modes():
    with pytest.raises(ValueError, match="reduce_scatter must be"):
        GroupCache(reduce_scatter="sometimes")
    assert GroupCache().get([5]) is None  # a group of one rank needs no communicator
