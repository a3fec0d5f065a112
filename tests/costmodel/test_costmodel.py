"""Cost-model tests. `CostModelContract` is the contract every CostModel implementation inherits (optuna-style)."""

import numpy as np
import pytest

from tidal.core import ParallelScheme, TidalError, get_cluster, get_model, parse_scheme
from tidal.costmodel import (
    AnalyticCostModel,
    Efficiency,
    LatencyCoeffs,
    MemoryConfig,
    budget_bytes,
    fitted_from_rows,
    load_cost_model,
    memory,
    stage_memory,
)
from tidal.costmodel.analytic import analytic_v1
from tidal.costmodel.fitted import ProfileRow, fit_rows, parse_profile

pytestmark = pytest.mark.unit

SCHEMES = ["tp1", "tp2", "tp4", "tp8", "tp2pp2", "pp4", "tp1cp2", "tp2cp4", "tp4pp2cp2", "pp3[12,10,10]"]


class CostModelContract:
    """Properties any cost model must have for the planner's bounds and invariants to hold."""

    def make(self):
        raise NotImplementedError

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_coeffs_nonnegative_and_deterministic(self, scheme):
        cm = self.make()
        dev = cm.cluster.device_type(0)
        s = parse_scheme(scheme)
        k1, k2 = cm.coeffs(s, dev), cm.coeffs(s, dev)
        assert k1 == k2
        assert k1.a >= 0 and k1.b > 0 and k1.c >= 0

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_micro_batch_time_is_superadditive_in_documents(self, scheme):
        """Merging two micro-batches never costs more than running them apart (one constant saved); splitting a
        document never costs more than the document plus one per-document constant d (l^2 term). The planner's lower
        bounds rely on both."""
        cm = self.make()
        k = cm.coeffs(parse_scheme(scheme), cm.cluster.device_type(0))
        x, y = [3000, 10], [700]
        assert k.mb_time(x + y) <= k.mb_time(x) + k.mb_time(y) + 1e-12
        assert k.doc_cost(1000) + k.doc_cost(500) <= k.doc_cost(1500) + k.d + 1e-12
        assert k.d >= 0
        assert k.mb_time([]) == 0.0

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_max_len_nonnegative(self, scheme):
        cm = self.make()
        assert cm.max_len(parse_scheme(scheme), cm.cluster.device_type(0)) >= 0


class TestAnalyticContract(CostModelContract):
    def make(self):
        return AnalyticCostModel(get_model("llama2-7b"), get_cluster("a800x64"))


def _synthetic_rows(truth: dict[str, LatencyCoeffs], seed: int, noise: float) -> list[ProfileRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for key, k in truth.items():
        for _ in range(12):
            lens = tuple(int(x) for x in rng.integers(64, 8192, size=rng.integers(1, 5)))
            t = k.mb_time(lens) * (1 + noise * rng.standard_normal())
            rows.append(ProfileRow(parse_scheme(key), lens, float(t)))
    return rows


TRUTH = {"tp1pp1cp1": LatencyCoeffs(2e-9, 1e-4, 3e-3), "tp2pp1cp1": LatencyCoeffs(1e-9, 5.5e-5, 4e-3)}


class TestFittedContract(CostModelContract):
    def make(self):
        return fitted_from_rows(_synthetic_rows(TRUTH, 0, 0.01), get_model("llama2-7b"), get_cluster("a800x64"))


def test_analytic_scales_with_tp_and_memory_grows():
    cm = AnalyticCostModel(get_model("llama2-7b"), get_cluster("a800x64"))
    dev = cm.cluster.device_type(0)
    k1, k2 = cm.coeffs(ParallelScheme(tp=1), dev), cm.coeffs(ParallelScheme(tp=2), dev)
    # TP halves the attention work per GPU at a lower kernel efficiency (narrower heads per GPU, decision 76): exactly
    # the efficiency ratio more than half
    e = cm.eff
    assert k2.a == pytest.approx(k1.a / 2 * e.attn_eff(4096) / e.attn_eff(2048))
    assert k1.a / 2 < k2.a < k1.a
    assert k2.b < k1.b
    v1 = analytic_v1(cm.model, cm.cluster)  # flat efficiencies: exactly half
    assert v1.coeffs(ParallelScheme(tp=2), dev).a == pytest.approx(v1.coeffs(ParallelScheme(tp=1), dev).a / 2)
    lens = [cm.max_len(ParallelScheme(tp=t), dev) for t in (1, 2, 4, 8)]
    assert lens == sorted(lens) and lens[0] > 4096
    # CP divides attention work too, but pays K/V all-gather
    assert cm.coeffs(ParallelScheme(cp=2), dev).a == pytest.approx(k1.a / 2)


def test_max_len_is_the_memory_edge():
    m, c = get_model("llama2-13b"), get_cluster("a800x16")
    dev, cfg = c.device_type(0), MemoryConfig()
    budget = budget_bytes(dev, cfg)
    assert budget == dev.memory_bytes * 0.9 - 2e9  # 80 GB: the full 2 GB workspace applies
    for key in ["tp2", "tp4pp2", "tp2cp2", "pp4[4,12,12,12]"]:
        s = parse_scheme(key)
        ml = AnalyticCostModel(m, c).max_len(s, dev)
        assert max(stage_memory(m, s, c.num_devices, ml, cfg)) <= budget
        assert max(stage_memory(m, s, c.num_devices, ml + 1, cfg)) > budget


def test_scheme_that_cannot_hold_its_states_has_max_len_zero():
    cm = AnalyticCostModel(get_model("llama3-70b"), get_cluster("a800x8"))
    assert cm.max_len(ParallelScheme(tp=1), cm.cluster.device_type(0)) == 0


def test_small_devices_keep_a_budget():
    """A 2 GiB CPU rank must not lose its whole budget to the 2 GB GPU workspace: tiny plans on cpuxN."""
    c = get_cluster("cpux4")
    cm = AnalyticCostModel(get_model("tiny"), c)
    assert budget_bytes(c.device_type(0), MemoryConfig()) > 1.5 * 2**30
    assert cm.max_len(ParallelScheme(tp=2, cp=2), c.device_type(0)) > 100_000


def test_mixed_gpu_types_differ():
    c = get_cluster("h800x16+h20x32")
    cm = AnalyticCostModel(get_model("llama-32b"), c)
    s = ParallelScheme(tp=4, pp=4)
    h800, h20 = c.device_type(0), c.device_type(16)
    assert cm.coeffs(s, h20).a > 6 * cm.coeffs(s, h800).a  # 990 vs 148 TFLOPs
    assert cm.max_len(s, h20) > cm.max_len(s, h800)  # 96 GB vs 80 GB


def test_bad_efficiency_rejected():
    with pytest.raises(TidalError):
        Efficiency(gemm=0)


def test_fit_recovers_known_coefficients():
    fits = fit_rows(_synthetic_rows(TRUTH, seed=1, noise=0.0))
    for key, k in TRUTH.items():
        got = fits[key].coeffs
        for L in (128, 4096, 32768):
            assert got.mb_time([L]) == pytest.approx(k.mb_time([L]), rel=1e-6)
        assert fits[key].rel_rmse < 1e-8


def test_fit_with_noise_is_close_and_reports_error():
    fits = fit_rows(_synthetic_rows(TRUTH, seed=2, noise=0.02))
    for key, k in TRUTH.items():
        assert fits[key].coeffs.mb_time([8192]) == pytest.approx(k.mb_time([8192]), rel=0.03)
        assert 0.005 < fits[key].rel_rmse < 0.05


def test_unprofiled_scheme_falls_back_to_scaled_analytic(tmp_path):
    m, c = get_model("llama2-7b"), get_cluster("a800x64")
    fm = fitted_from_rows(_synthetic_rows(TRUTH, 0, 0.0), m, c)
    dev = c.device_type(0)
    s = ParallelScheme(tp=4)
    ana = AnalyticCostModel(m, c).coeffs(s, dev)
    got = fm.coeffs(s, dev)
    sa, sb, sc = fm.term_scale
    assert (got.a, got.b, got.c) == pytest.approx((ana.a * sa, ana.b * sb, ana.c * sc))
    # each term keeps the profiled schemes' measured balance: the fitted/analytic ratios of a and of b
    from tidal.core.scheme import parse_scheme

    ratios = [f.coeffs.a / AnalyticCostModel(m, c).coeffs(parse_scheme(k), dev).a for k, f in fm.fits.items()]
    assert sa == pytest.approx(float(np.median(ratios)))
    path = tmp_path / "cm.json"
    path.write_text(fm.to_json("a800"))
    back = load_cost_model(path, m, c)
    assert back.coeffs(ParallelScheme(tp=2), dev) == fm.coeffs(ParallelScheme(tp=2), dev)


@pytest.mark.parametrize(
    "text,msg",
    [
        ("a,b\n", "header"),
        ("scheme,lengths,seconds\n", "no rows"),
        ("scheme,lengths,seconds\ntp1,12 x,0.1\n", "row 2"),
        ("scheme,lengths,seconds\ntp1,12,-1\n", "positive"),
        ("scheme,lengths,seconds\ntq1,12,1\n", "row 2"),
    ],
)
def test_malformed_profiles(text, msg):
    with pytest.raises(TidalError, match=msg):
        parse_profile(text)


def test_too_few_rows_to_fit():
    with pytest.raises(TidalError, match=">= 3"):
        fit_rows(parse_profile("scheme,lengths,seconds\ntp1,12,0.1\ntp1,40,0.2\n"))


def test_malformed_model_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"format": "nope"}')
    with pytest.raises(TidalError, match="not a Tidal cost model"):
        load_cost_model(p, get_model("tiny"), get_cluster("cpux2"))


def test_executor_memory_charge_is_the_edge_and_below_app_c1():
    """MemoryConfig(mode="executor") (the executor's resident bytes by phase, docs/costmodel.md): MaxLen is still the
    memory edge of stage_memory, and never above the App. C.1 charge (fp32 gradients, pull buffers)."""
    m, c = get_model("llama2-7b"), get_cluster("a800x64")
    dev, ex = c.device_type(0), MemoryConfig(mode="executor")
    budget = budget_bytes(dev, ex)
    for key in ["tp2", "tp4pp2", "tp2cp2", "tp8"]:
        s = parse_scheme(key)
        ml = memory.max_len(m, s, dev, c.num_devices, ex)
        assert 0 < ml <= memory.max_len(m, s, dev, c.num_devices, MemoryConfig())
        assert max(stage_memory(m, s, c.num_devices, ml, ex)) <= budget < max(stage_memory(m, s, c.num_devices,
                                                                                          ml + 1, ex))
