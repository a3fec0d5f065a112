"""The per-micro-batch attention backend rule (`core.attnrule.H200_RULE`, decision 119), fitted on H200 measurements.

Inputs (benchmarks/data/, one H200, PyTorch 2.11, bf16, no flash-attn; decision 116): `tidal profile` rows of the same
micro-batches run with sdpa and with flex:
- FIT: llama2-7b x 4 layers, sdpa (`h200-llama2-7b-4layers-profile-sdpa.csv`) against the mean of the two flex runs
  (`h200-llama2-7b-4layers-profile.csv`, `-flex2.csv`): 12 micro-batches of 1K, 4K and 16K tokens, 1-16 documents;
- HELD OUT: llama3.2-1b (16 layers, head dim 64, GQA 32/8), sdpa against flex: 16 micro-batches of 1K-32K tokens.
The rule models t_sdpa - t_flex per layer as seg_cost * S - flex_const - flex_work * W (core/attnrule.py); the
three constants come from non-negative least squares on the FIT rows. Printed per row set: the rule's pick against
the measured faster backend, the time a wrong pick loses (of the faster one's time), and the summed time of always
flex (`auto` on a GPU before decision 119 and from 133 to 140), always sdpa, the rule, and the best of the two per
micro-batch.
The summed-time ratios are an ESTIMATE of the gain from measured single-micro-batch rows, not an end-to-end
measurement (not measured: no GPU here).

Then the cost model (`costmodel.analytic.EFFICIENCY_EAGER_MIXED`, `--cost-model analytic-eager-mixed`): its `attn`
fitted (least squares, every other term EFFICIENCY_EAGER's, attention flat across widths) on the FIT rows' measured
time of the rule's pick, and the median / worst |error| per micro-batch of EFFICIENCY_EAGER (flex) and of
EFFICIENCY_EAGER_MIXED against the rule's pick, sdpa and flex, on both row sets.

    python benchmarks/attn_rule_fit.py
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from tidal.core import ParallelScheme, get_cluster
from tidal.core.attnrule import H200_RULE, AttnBackendRule, causal_pairs
from tidal.costmodel.analytic import EFFICIENCY_EAGER, EFFICIENCY_EAGER_MIXED, AnalyticCostModel, Efficiency
from tidal.costmodel.fitted import read_profile
from tidal.runtime.config import model_arg

DATA = Path(__file__).resolve().parent / "data"
EX = Path(__file__).resolve().parent.parent / "examples"
FIT = ("llama2-7b x4 (fit)", str(EX / "model-llama2-7b-4layers.toml"), "h200-llama2-7b-4layers-profile-sdpa.csv",
       ("h200-llama2-7b-4layers-profile.csv", "h200-llama2-7b-4layers-profile-flex2.csv"))
HELD_OUT = ("llama3.2-1b (held out)", "llama3.2-1b", "h200-llama3.2-1b-profile-sdpa.csv",
            ("h200-llama3.2-1b-profile-flex.csv",))


def rows(model: str, sdpa: str, flex: tuple[str, ...]):
    """(lengths, sdpa s, flex s, layers, heads, head dim) per micro-batch; flex is the mean of its runs."""
    spec = model_arg(model).spec()
    sd = read_profile(DATA / sdpa)
    fl = [read_profile(DATA / f) for f in flex]
    out = []
    for i, r in enumerate(sd):
        if any(list(f[i].lengths) != list(r.lengths) for f in fl):
            raise SystemExit(f"{sdpa} and {flex} list different micro-batches at row {i}")
        out.append((list(r.lengths), r.seconds, float(np.mean([f[i].seconds for f in fl])), spec.layers, spec.heads,
                    spec.head_dim))
    return out


def features(lengths, heads, head_dim):
    return [len(lengths), -1.0, -float(heads * head_dim * sum(causal_pairs(n, n) for n in lengths))]


def fit(fit_rows) -> AttnBackendRule:
    x = np.array([features(ls, h, d) for ls, _, _, _, h, d in fit_rows])
    y = np.array([(ts - tf) / layers for _, ts, tf, layers, _, _ in fit_rows])
    scale = np.abs(x).max(axis=0)
    coef, _ = nnls(x / scale, y)
    coef = coef / scale
    return AttnBackendRule(float(coef[0]), float(coef[1]), float(coef[2]), source="refit")


def report(name: str, rule: AttnBackendRule, rs) -> None:
    print(f"\n{name}: {len(rs)} micro-batches")
    print(f"  {'lengths':<26} {'sdpa ms':>9} {'flex ms':>9} {'faster':>7} {'rule':>6} {'margin ms/layer':>16} "
          f"{'lost':>6}")
    wrong, lost, tot = 0, [], {"flex": 0.0, "sdpa": 0.0, "rule": 0.0, "best": 0.0}
    for ls, ts, tf, _, h, d in rs:
        t = {"sdpa": ts, "flex": tf}
        best = min(t, key=t.get)
        pick = rule.pick_lengths(ls, h, d)
        loss = t[pick] / t[best] - 1
        wrong += pick != best
        lost.append(loss)
        tot["flex"] += tf
        tot["sdpa"] += ts
        tot["rule"] += t[pick]
        tot["best"] += t[best]
        desc = f"{len(ls)} x {ls[0]}" if len(set(ls)) == 1 else " ".join(map(str, ls))
        print(f"  {desc:<26} {ts * 1e3:9.1f} {tf * 1e3:9.1f} {best:>7} {pick:>6} "
              f"{rule.margin(ls, ls, h, d) * 1e3:16.2f} {loss:6.1%}")
    bad = [x for x in lost if x > 0]
    print(f"  wrong picks {wrong}/{len(rs)}; time lost per wrong pick: "
          + (f"median {statistics.median(bad):.1%}, worst {max(bad):.1%}" if bad else "none")
          + f"; over all rows: mean {statistics.mean(lost):.1%}")
    print(f"  summed time (estimate from these rows): always flex {tot['flex']:.3f} s, always sdpa {tot['sdpa']:.3f} s,"
          f" rule {tot['rule']:.3f} s, best per micro-batch {tot['best']:.3f} s; rule / always flex "
          f"{tot['rule'] / tot['flex']:.3f}, rule / always sdpa {tot['rule'] / tot['sdpa']:.3f}")


def mb_time(model: str, eff: Efficiency, lengths) -> float:
    cluster = get_cluster("h200x1")
    cm = AnalyticCostModel(model_arg(model).spec(), cluster, eff)
    return cm.coeffs(ParallelScheme(1, 1, 1), cluster.groups[0].device).mb_time(lengths)


def picked(rs, rule: AttnBackendRule) -> list[float]:
    """The measured time of the backend the rule picks, per micro-batch."""
    return [ts if rule.pick_lengths(ls, h, d) == "sdpa" else tf for ls, ts, tf, _, h, d in rs]


def fit_attn(model: str, rs, rule: AttnBackendRule) -> float:
    """EFFICIENCY_EAGER with a flat attention efficiency fitted to the rule's picks: T = F + A / attn per row."""
    flat = replace(EFFICIENCY_EAGER, attn_half_width=0.0)
    a, y = [], []
    for (ls, *_), t in zip(rs, picked(rs, rule)):
        t1, t05 = mb_time(model, replace(flat, attn=1.0), ls), mb_time(model, replace(flat, attn=0.5), ls)
        a.append(t05 - t1)
        y.append(t - (2 * t1 - t05))
    a, y = np.asarray(a), np.asarray(y)
    return min(1.0, float(a @ a / (a @ y)))


def cost_report(fit_rows, held) -> None:
    print(f"\ncost model: attn fitted on {FIT[0]}'s rule picks: {fit_attn(FIT[1], fit_rows, H200_RULE):.3f} "
          f"(EFFICIENCY_EAGER_MIXED.attn {EFFICIENCY_EAGER_MIXED.attn}; EFFICIENCY_EAGER.attn {EFFICIENCY_EAGER.attn} "
          f"at half width {EFFICIENCY_EAGER.attn_half_width:g})")
    print(f"  {'rows':<24} {'model':<24} {'vs rule pick':>22} {'vs sdpa':>22} {'vs flex':>22}")
    print(f"  {'':<24} {'':<24}" + f" {'median  worst signed':>22}" * 3)
    for (name, model, *_), rs in ((FIT, fit_rows), (HELD_OUT, held)):
        for label, eff in (("EFFICIENCY_EAGER", EFFICIENCY_EAGER), ("EFFICIENCY_EAGER_MIXED", EFFICIENCY_EAGER_MIXED)):
            cells = []
            for meas in (picked(rs, H200_RULE), [r[1] for r in rs], [r[2] for r in rs]):
                err = [mb_time(model, eff, r[0]) / t - 1 for r, t in zip(rs, meas)]
                mags = [abs(x) for x in err]
                cells.append(f"{statistics.median(mags):6.1%} {max(mags):6.1%} {statistics.median(err):+7.1%}")
            print(f"  {name:<24} {label:<24} " + " ".join(f"{c:>22}" for c in cells))


def main() -> None:
    fit_rows, held = rows(*FIT[1:]), rows(*HELD_OUT[1:])
    rule = fit(fit_rows)
    print(f"fitted: seg_cost {rule.seg_cost:.3g} s/segment/layer, flex_const {rule.flex_const:.3g} s/layer, "
          f"flex_work {rule.flex_work:.3g} s per head*dim*pair per layer")
    print(f"H200_RULE (core/attnrule.py): seg_cost {H200_RULE.seg_cost:.3g}, flex_const {H200_RULE.flex_const:.3g}, "
          f"flex_work {H200_RULE.flex_work:.3g}")
    for name, rs in ((FIT[0], fit_rows), (HELD_OUT[0], held)):
        report(name, H200_RULE, rs)
    cost_report(fit_rows, held)


if __name__ == "__main__":
    main()
