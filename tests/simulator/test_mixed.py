"""Mixed clusters: the proposal never offers a scheme that cannot run on the device type placement puts it on."""

import pytest

from tidal.core.cluster import get_cluster
from tidal.core.model import get_model
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.data.sources import length_source
from tidal.planner.proposal import propose
from tidal.planner.select import profile_strategies

pytestmark = pytest.mark.unit


def test_proposal_fits_every_placed_device_type():
    # llama-32b tp2 fits a 96 GB H20 but not an 80 GB H800: sizing schemes on the H20 alone used to offer it
    cm = AnalyticCostModel(get_model("llama-32b"), get_cluster("h800x16+h20x32"))
    sample = length_source("synthetic:commoncrawl", 0).lengths(0, 4000)
    prop = propose(sample, cm, tokens_per_step=200000, max_len=32768, eval_steps=3, seed=0)
    assert prop.strategies
    for s in prop.strategies:
        for p in s.pipelines:
            for d in p.devices:
                assert cm.max_len(p.scheme, cm.cluster.device_type(d)) > 0, (str(s), p.scheme)
    profile_strategies(prop.strategies, cm)  # raised "does not fit in h800 memory" before
