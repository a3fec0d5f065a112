"""Profiled cost model files (round trip into `--cost-model`), measured MaxLen and its fallback, the online refit."""

import json
from types import MappingProxyType

import numpy as np
import pytest

from tidal.cli.main import main
from tidal.core import TidalError, get_cluster, get_model
from tidal.core.scheme import ParallelScheme, parse_scheme
from tidal.costmodel import AnalyticCostModel, LatencyCoeffs, MemoryConfig, fit_rows, load_cost_model
from tidal.costmodel.fitted import FittedCostModel, ProfileRow
from tidal.costmodel.memory import budget_bytes, fit_activation_bytes, measured_max_len, states_bytes
from tidal.costmodel.refit import PipelineObs, refit_model, robust_fit

TINY, CPU4 = get_model("tiny"), get_cluster("cpux4")
# tp1 has a per-document term (as CPU SDPA does), tp2 none
TRUE = {"tp1pp1cp1": LatencyCoeffs(2.2e-7, 5.4e-5, 0.013, 7e-4), "tp2pp1cp1": LatencyCoeffs(1.1e-7, 4.3e-5, 0.018)}


def _rows(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for key, k in TRUE.items():
        for _ in range(12):
            lens = tuple(int(x) for x in rng.integers(16, 1024, size=int(rng.integers(1, 9))))
            out.append(ProfileRow(parse_scheme(key), lens, k.mb_time(lens)))
    return out


def test_profile_json_round_trip_is_what_plan_uses(tmp_path):
    fits = fit_rows(_rows())
    fits = {k: f.__class__(f.coeffs, f.rows, f.rel_rmse, 7777 if k == "tp1pp1cp1" else None)
            for k, f in fits.items()}
    fm = FittedCostModel(TINY, CPU4, MappingProxyType(fits), AnalyticCostModel(TINY, CPU4))
    path = tmp_path / "profile.json"
    path.write_text(fm.to_json("cpu", {"memory": {"device_bytes": 1.0}}))
    back = load_cost_model(path, TINY, CPU4)
    dev = CPU4.device_type(0)
    for key, k in TRUE.items():
        got = back.coeffs(parse_scheme(key), dev)
        assert (got.a, got.b, got.c) == pytest.approx((k.a, k.b, k.c), rel=1e-6)
        assert got.d == pytest.approx(k.d, rel=1e-6, abs=1e-12)
    assert back.max_len(ParallelScheme(1), dev) == 7777
    # no max_len in the file for tp2: the analytic memory model's (documented fallback)
    assert back.max_len(ParallelScheme(2), dev) == AnalyticCostModel(TINY, CPU4).max_len(ParallelScheme(2), dev)
    # `tidal plan --cost-model` plans with exactly these coefficients: one pipeline, one micro-batch per step here
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny", "--cluster", "cpux1", "--strategies", "tp1", "--cost-model", str(path),
                 "--data", "synthetic:github", "--max-len", "512", "--tokens-per-step", "1024", "--steps", "2",
                 "--json", str(out), "--quiet"]) == 0
    plan = json.loads(out.read_text())
    k = TRUE["tp1pp1cp1"]
    for st in plan["steps"]:
        (p,) = st["pipelines"]
        # one stage: the sum of its micro-batch times (decision 94)
        want = sum(k.mb_time([st["seq_lengths"][i] for i in mb]) for mb in p["micro_batches"])
        assert p["est_time"] == pytest.approx(want, rel=1e-9)


def test_bad_max_len_in_model_file(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"format": "tidal-costmodel/1", "model": "tiny",
                             "schemes": {"tp1": {"a": 1e-9, "b": 1e-6, "c": 0.0, "max_len": -3}}}))
    with pytest.raises(TidalError, match="max_len >= 0"):
        load_cost_model(p, TINY, CPU4)


def test_activation_fit_and_measured_max_len_is_the_memory_edge():
    m1, m2 = 44088.0, 3.0
    pts = [((n,), m1 * n + m2 * n * n) for n in (256, 512, 1024, 2048)] + [((256, 256), m1 * 512 + m2 * 2 * 256**2)]
    act = fit_activation_bytes(pts, "saved-tensors")
    assert (act.m1, act.m2) == pytest.approx((m1, m2), rel=1e-6)
    dev, cfg = CPU4.device_type(0), MemoryConfig()
    for scheme in (ParallelScheme(1), ParallelScheme(1, 2, 1)):
        ml = measured_max_len(TINY, scheme, dev, 4, act, cfg)
        states = states_bytes(TINY, scheme, 4, cfg)[0]  # the states beside the activations (the backward phase)
        used = [states + scheme.pp * act.bytes_at(x) for x in (ml, ml + 1)]
        assert used[0] <= budget_bytes(dev, cfg) < used[1]
    assert measured_max_len(TINY, ParallelScheme(1, 2, 1), dev, 4, act, cfg) < measured_max_len(
        TINY, ParallelScheme(1), dev, 4, act, cfg)
    with pytest.raises(TidalError, match=">= 3"):
        fit_activation_bytes(pts[:2], "saved-tensors")


def _obs(truth: LatencyCoeffs, n: int, seed: int, noise: float) -> list[PipelineObs]:
    """Per-pipeline rows as training produces them: V micro-batches of random packed documents; every tenth row is
    a 3x outlier (another process took the core)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = int(rng.integers(1, 7))
        # long-tailed lengths, as in corpora: many short documents, where the per-document term d shows
        mbs = [np.clip(np.exp(rng.normal(4.5, 1.3, size=int(rng.integers(1, 17)))), 4, 1024).astype(np.int64)
               for _ in range(v)]
        sq = float(sum((m.astype(float) ** 2).sum() for m in mbs))
        ln = float(sum(m.sum() for m in mbs))
        nd = sum(m.size for m in mbs)
        t = (truth.a * sq + truth.b * ln + truth.c * v + truth.d * nd) * (1 + noise * rng.standard_normal())
        out.append(PipelineObs("tp1pp1cp1", sq, ln, v, t * 3.0 if i % 10 == 0 else t, nd))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_robust_refit_recovers_known_coefficients_despite_outliers(seed):
    truth = TRUE["tp1pp1cp1"]
    obs = _obs(truth, 200, seed=seed, noise=0.02)
    prior = (truth.a * 2, truth.b * 0.5, truth.c * 3, truth.d * 0.3)  # a bad starting model
    X = np.array([o.features() for o in obs])
    t = np.array([o.seconds for o in obs])
    want = np.array([truth.a, truth.b, truth.c, truth.d])
    got = robust_fit(X, t, prior)
    # 2 % noise, 200 rows: a, b, c within 10 %; d (a few % of a row's time, and pulled toward the prior's 0.3 d
    # by the weak ridge) within 25 %
    assert got[:3] == pytest.approx(want[:3], rel=0.1)
    assert got[3] == pytest.approx(want[3], rel=0.25)
    # plain least squares (relative error) is pulled off by the 10 % of 3x outliers: the robustness does the work
    ls = np.linalg.lstsq(X / t[:, None], np.ones(len(t)), rcond=None)[0]
    assert np.max(np.abs(ls[:3] / want[:3] - 1)) > 1.5 * np.max(np.abs(got[:3] / want[:3] - 1))
    model = refit_model(AnalyticCostModel(TINY, CPU4), obs)
    dev = CPU4.device_type(0)
    k = model.coeffs(ParallelScheme(1), dev)
    assert (k.a, k.b, k.c) == pytest.approx(tuple(want[:3]), rel=0.1)
    assert k.d == pytest.approx(want[3], rel=0.25)  # the weak ridge pulls d toward the analytic prior's 0
    assert model.max_len(ParallelScheme(1), dev) == AnalyticCostModel(TINY, CPU4).max_len(ParallelScheme(1), dev)
    assert refit_model(AnalyticCostModel(TINY, CPU4), obs) == model  # deterministic


def test_refit_keeps_unobserved_and_unidentified_terms_at_the_prior():
    truth = TRUE["tp1pp1cp1"]
    base = FittedCostModel(TINY, CPU4, MappingProxyType(fit_rows(_rows())), AnalyticCostModel(TINY, CPU4))
    # every pipeline runs one micro-batch of the same two lengths: only a * sum_sq + b * sum_len + c is identified
    obs = [PipelineObs("tp1pp1cp1", 2 * 500.0**2, 1000.0, 1, 1.3 * truth.mb_time([500, 500]), 2) for _ in range(10)]
    model = refit_model(base, obs)
    dev = CPU4.device_type(0)
    assert model.coeffs(ParallelScheme(1), dev).mb_time([500, 500]) == pytest.approx(
        1.3 * truth.mb_time([500, 500]), rel=0.01)
    assert model.coeffs(ParallelScheme(2), dev) == base.coeffs(ParallelScheme(2), dev)
    with pytest.raises(TidalError, match="no scheme has 6"):
        refit_model(AnalyticCostModel(TINY, CPU4), obs[:3])
    with pytest.raises(TidalError, match="targets finite and > 0"):
        robust_fit(np.ones((3, 3)), np.array([1.0, 0.0, 1.0]))
