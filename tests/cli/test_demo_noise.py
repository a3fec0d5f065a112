"""`tidal demo`'s honest figures (cli/demo.py): alternating run order, ratios beside the noise floor."""

import pytest

from tidal.cli.demo import ratio_stats, run_order, spread

pytestmark = pytest.mark.unit


def _rounds(tidal, static):
    return [{"tidal": {"x": a}, "static": {"x": b}} for a, b in zip(tidal, static)]


def test_run_order_alternates():
    assert run_order(1) == ["tidal", "static"]
    assert run_order(3) == ["tidal", "static", "static", "tidal", "tidal", "static"]


def test_ratio_within_noise_and_beyond():
    # same-strategy totals 10 and 12 (spread 2/11 = 18%): a 5 % faster static is within noise
    r = ratio_stats(_rounds([10.0, 12.0], [9.5, 11.4]), "x")
    assert r["noise"] == pytest.approx(2 / 11) and r["median"] == pytest.approx(0.95)
    assert r["verdict"] == "within noise"
    # quiet runs (spread 1 %): a 1.3x ratio is a real difference, and so is 0.8x
    assert ratio_stats(_rounds([10.0, 10.1], [13.0, 13.1]), "x")["verdict"] == "Tidal faster"
    assert ratio_stats(_rounds([10.0, 10.1], [8.0, 8.1]), "x")["verdict"] == "static faster"
    one = ratio_stats(_rounds([10.0], [13.0]), "x")
    assert one["noise"] is None and one["verdict"].startswith("noise not measured")
    assert spread([1.0]) is None and spread([2.0, 4.0, 3.0]) == pytest.approx(2 / 3)


def _summary(wall_ratios, noise):
    import numpy as np

    return {"wall": {"median": float(np.median(wall_ratios)), "noise": noise,
                     "verdict": "within noise" if noise is not None and abs(np.median(wall_ratios) - 1) <= noise
                     else "faster"},
            "rounds": [{}] * len(wall_ratios)}


def test_meaning_says_what_the_figure_is():
    from tidal.cli.demo import meaning

    within = meaning(_summary([1.01, 1.03], 0.05), "tp2", {"tp1": 5026})
    assert "1.020x" in within and "within the noise floor (5.0%)" in within and "cannot be told apart" in within
    beyond = meaning(_summary([1.2, 1.3], 0.02), "tp2", {"tp1": 5026})
    assert "Tidal is faster" in beyond and "5,026-token MaxLen" in beyond
    assert "noise floor is unknown" in meaning(_summary([1.2], None), "tp2", {})
    slower = meaning(_summary([0.7, 0.8], 0.02), "tp2", {"tp1": 5026})
    assert "tp2 is faster by more than the noise floor" in slower and "MaxLen" not in slower


def test_strategy_counts():
    from tidal.cli.demo_sim import strategy_counts

    assert strategy_counts(["tp2", "2*tp1", "tp2", "cp2", "tp2"]) == "tp2 x3; 2*tp1 x1; cp2 x1"
    assert strategy_counts([]) == ""


def test_simulated_section_on_the_pool():
    """The simulated section plans and runs on Hydraulis' measured pool when it is there (its fallback, the analytic
    model, is exercised by test_demo_small)."""
    from tidal.cli.demo_sim import SCENARIO, default_pools, simulate_section

    if not (default_pools() / SCENARIO["pool"]).is_file():
        pytest.skip("Hydraulis' pools are not in ../shared on this machine")
    sec = simulate_section(1)
    assert sec.pooled and "strategy_pool_7b.json" in sec.source
    names = [r[0] for r in sec.rows]
    assert names == ["megatron", "hydraulis", "tidal"]
    assert dict((r[0], r[4]) for r in sec.rows)["megatron"] == pytest.approx(1.0)
    assert all(r[2] > 0 and r[3] > 0 for r in sec.rows)
