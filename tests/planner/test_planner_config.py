"""PlannerConfig (decision 85): one frozen value holds the planner's knobs, checked at the edge; presets."""

import dataclasses

import numpy as np
import pytest
from planner_synth import PROFILES

from tidal.core.errors import TidalError
from tidal.planner.config import DEFAULT, PROPOSAL, PlannerConfig
from tidal.planner.select import assign, select_step

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bad", [dict(passes=("fill", "late_restarts")), dict(passes=("class_fill",)),
                                 dict(passes=("fill", "fill")), dict(passes=["fill"]), dict(scan="yes"),
                                 dict(restart_max=-1), dict(restart_max=2.0),
                                 dict(fill_gap=1.5), dict(late_gap=-0.1), dict(late_restarts=True),
                                 dict(shrink_fracs=(0.9, 1.5)), dict(shrink_fracs=[0.9]), dict(shrink_rounds=0),
                                 dict(polish_rounds=True),
                                 dict(late_restart_max_big=100), dict(repair_tries=0), dict(repair_excess=0.0),
                                 dict(repair_gap=1.5), dict(repair_moves=-1), dict(repair_partners=2.5),
                                 dict(repair_max=-1)])
def test_bad_knobs_are_one_line_errors(bad):
    with pytest.raises(TidalError) as e:
        PlannerConfig(**bad)
    assert "\n" not in str(e.value) and next(iter(bad)) in str(e.value)


def test_frozen_and_presets():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.passes = ()  # type: ignore[misc]
    assert PlannerConfig() == DEFAULT
    assert PROPOSAL.passes == () and PROPOSAL.scan is False  # the proposal planner: no passes, no jump scan


def test_config_reaches_the_passes():
    """The cheap preset turns the improvement passes off (never faster than the default, which keeps a pass's result
    only when faster); select_step plans with the config it is given."""
    prof = PROFILES[6]  # PP 1, 1 and 2 (PROFILES[3] seed 5 before decision 94, where the passes no longer gain)
    l_ = np.minimum(np.ceil(np.random.default_rng(3).lognormal(3.0, 0.9, 300)), prof.max_len).astype(np.int64)
    full, cheap = assign(l_, prof)[0], assign(l_, prof, config=PROPOSAL)[0]
    assert full < cheap  # on this step the passes gain
    assert select_step(l_, [prof]).plan.est_step_time < select_step(l_, [prof], config=PROPOSAL).plan.est_step_time
