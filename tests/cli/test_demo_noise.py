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
