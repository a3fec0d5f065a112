"""Cost models against Hydraulis' published strategy pools (decision 76, docs/costmodel.md "Calibration").

For every pool (/work/shared/data/hydraulis-profiles/strategy_pool_{7b,13b,32b,7b_A100}.json) x profiled <TP, PP>
x sequence length 512..32K, the relative error (predicted / profiled - 1) of the time of one sequence on one stage,
forward + backward (the pool's a s^2 + b s + c ms), for:
  pool       the pool as a cost model (`--cost-model POOL.json`): exact on its schemes by construction;
  pool-loo   the pool model with that scheme left out, i.e. its anchored extrapolation (nearest profiled scheme x
             the analytic ratio): how well it prices a scheme it has not seen;
  analytic   the calibrated analytic model (defaults fit on the 7b and 13b pools; 32b and 7b_A100 held out);
  v1         the analytic model before decision 76.
Summaries: median, p90 and worst |error| per pool and model, over all lengths and over the lengths the scheme can
hold under the pool's own memory regression (where the profile is a measurement rather than an extrapolation).
Then the per-GPU cost per token of TP4 / TP8 relative to TP1 (llama2-7b, issue 24's table), and the analytic
model's prediction on H800 and H20 (extrapolated by their specs; not measured).

Usage: python benchmarks/costmodel_profiles.py [--pools DIR] [--refit] [--rows]
  --refit  refit the analytic constants on the 7b and 13b pools (scipy least squares on log time ratios) and print
           them with their held-out errors (the defaults in costmodel/analytic.py are this fit, rounded).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from tidal.core import get_cluster, get_model
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.analytic import AnalyticCostModel, Efficiency, analytic_v1
from tidal.costmodel.pool import pool_cost_model, pool_max_len, read_pool

POOLS = {"7b": ("llama2-7b", "a800x64"), "13b": ("llama2-13b", "a800x64"), "32b": ("hydraulis-32b", "a800x64"),
         "7b_A100": ("llama2-7b", "a100-40x64")}
FIT_POOLS = ("7b", "13b")
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
MODELS = ("pool", "pool-loo", "analytic", "v1")
REFIT = ("gemm", "gemm_half_flops", "attn", "attn_half_width", "comm", "launch_per_layer", "tp_const_per_layer")


def stats(v) -> str:
    a = np.abs(np.asarray(v, dtype=np.float64))
    if a.size == 0:
        return "-"
    return f"median {np.median(a):6.1%}  p90 {np.percentile(a, 90):6.1%}  worst {a.max():6.1%}  (n={a.size})"


def errors(pool_dir: Path, analytic_eff: Efficiency | None = None) -> list[dict]:
    """One row per pool x scheme x length: the profiled ms and every model's relative error."""
    rows = []
    for name, (model, cluster) in POOLS.items():
        pool = read_pool(pool_dir / f"strategy_pool_{name}.json")
        m, c = get_model(model), get_cluster(cluster)
        dev = c.device_type(0)
        ana = AnalyticCostModel(m, c, analytic_eff) if analytic_eff else AnalyticCostModel(m, c)
        v1 = analytic_v1(m, c)
        full = pool_cost_model(pool, m, c, ana)
        for s in pool.schemes:
            sc = ParallelScheme(s.tp, s.pp, 1)
            loo = pool_cost_model(replace(pool, schemes=tuple(x for x in pool.schemes if x != s)), m, c, ana)
            ks = {"pool": full.coeffs(sc, dev), "pool-loo": loo.coeffs(sc, dev), "analytic": ana.coeffs(sc, dev),
                  "v1": v1.coeffs(sc, dev)}
            cap = pool_max_len(pool, sc, c.num_devices)
            for length in LENGTHS:
                truth = s.ms(length)
                rows.append({"name": name, "scheme": f"tp{s.tp}pp{s.pp}", "len": length, "ms": truth,
                             "fits": length <= cap,
                             **{k: k_.mb_time([length]) * 1e3 / truth - 1.0 for k, k_ in ks.items()}})
    return rows


def tp_ratios(pool_dir: Path) -> None:
    pool = read_pool(pool_dir / "strategy_pool_7b.json")
    m, c = get_model("llama2-7b"), get_cluster("a800x64")
    dev = c.device_type(0)
    models = {"analytic": AnalyticCostModel(m, c), "v1": analytic_v1(m, c)}

    def per_gpu(tp, pp, length, cm=None) -> float:
        t = pool.get(tp, pp).ms(length) / 1e3 if cm is None else cm.coeffs(ParallelScheme(tp, pp, 1), dev).mb_time(
            [length])
        return tp * pp * t / length

    print("\nper-GPU cost per token relative to TP1 (llama2-7b A800; TP1 is tp1pp2 x 2 GPUs, the pool has no tp1pp1)")
    print(f"{'':<10}" + "".join(f"{f'TP{t} {n // 1024}K':>10}" for t in (4, 8) for n in (1024, 4096, 16384)))
    print(f"{'pool':<10}" + "".join(f"{per_gpu(t, 1, n) / per_gpu(1, 2, n):>10.2f}" for t in (4, 8)
                                    for n in (1024, 4096, 16384)))
    for name, cm in models.items():
        cells = []
        for t in (4, 8):
            for n in (1024, 4096, 16384):
                r = per_gpu(t, 1, n, cm) / per_gpu(1, 2, n, cm)
                cells.append(f"{r:>5.2f}{r / (per_gpu(t, 1, n) / per_gpu(1, 2, n)) - 1:>+5.0%}")
        print(f"{name:<10}" + "".join(cells))


def devices() -> None:
    print("\nanalytic extrapolation to other devices (llama2-7b, 4K tokens, one stage fwd+bwd ms; not measured):")
    m = get_model("llama2-7b")
    schemes = [ParallelScheme(t, p, cp) for t, p, cp in ((1, 2, 1), (2, 1, 1), (4, 1, 1), (8, 1, 1), (4, 1, 2),
                                                         (8, 1, 4))]
    print(f"{'device':<8}" + "".join(f"{s.short():>11}" for s in schemes))
    for d in ("a800", "a100-40", "h800", "h20"):
        c = get_cluster(f"{d}x64")
        cm = AnalyticCostModel(m, c)
        print(f"{d:<8}" + "".join(f"{cm.coeffs(s, c.device_type(0)).mb_time([4096]) * 1e3:>11.1f}" for s in schemes))


def refit(pool_dir: Path) -> Efficiency:
    from scipy.optimize import least_squares

    base = Efficiency()
    x0 = np.array([getattr(base, f) for f in REFIT])

    def eff(x) -> Efficiency:
        return replace(base, **{f: float(v * s) for f, v, s in zip(REFIT, x, x0)})

    def resid(x):
        out = []
        for name in FIT_POOLS:
            model, cluster = POOLS[name]
            pool = read_pool(pool_dir / f"strategy_pool_{name}.json")
            cm = AnalyticCostModel(get_model(model), get_cluster(cluster), eff(x))
            dev = cm.cluster.device_type(0)
            for s in pool.schemes:
                k = cm.coeffs(ParallelScheme(s.tp, s.pp, 1), dev)
                out += [np.log(k.mb_time([n]) * 1e3 / s.ms(n)) for n in LENGTHS]
        return np.asarray(out)

    lo = np.array([0.05 / x0[0], 0, 0.05 / x0[2], 0, 0.05 / x0[4], 0, 0])
    hi = np.array([1 / x0[0], 100, 1 / x0[2], 100, 1 / x0[4], 100, 100])
    sol = least_squares(resid, np.ones(len(REFIT)), bounds=(lo, hi))
    e = eff(sol.x)
    print("refit on " + ", ".join(FIT_POOLS) + ": " + ", ".join(f"{f}={getattr(e, f):.3g}" for f in REFIT))
    return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pools", type=Path, default=Path("/work/shared/data/hydraulis-profiles"))
    ap.add_argument("--refit", action="store_true")
    ap.add_argument("--rows", action="store_true", help="print every pool x scheme x length row")
    a = ap.parse_args()
    eff = refit(a.pools) if a.refit else None
    rows = errors(a.pools, eff)
    if a.rows:
        print(f"{'pool':<8}{'scheme':<9}{'len':>6}{'ms':>9}{'fits':>5}" + "".join(f"{m:>10}" for m in MODELS))
        for r in rows:
            print(f"{r['name']:<8}{r['scheme']:<9}{r['len']:>6}{r['ms']:>9.1f}{'y' if r['fits'] else 'n':>5}"
                  + "".join(f"{r[m]:>+10.1%}" for m in MODELS))
    print(f"\nrelative error vs the profiles; analytic fit on {', '.join(FIT_POOLS)} (others held out)")
    for m in MODELS:
        print(f"\n{m}:")
        for name in POOLS:
            sel = [r for r in rows if r["name"] == name]
            tag = "fit " if name in FIT_POOLS and m == "analytic" else "held" if m == "analytic" else "    "
            print(f"  {name:<8}{tag}  all lengths {stats([r[m] for r in sel])}")
            print(f"  {'':<8}      <= MaxLen   {stats([r[m] for r in sel if r['fits']])}")
        print(f"  {'all':<8}      all lengths {stats([r[m] for r in rows])}")
    tp_ratios(a.pools)
    devices()


if __name__ == "__main__":
    main()
