"""The analytic model's eager-runtime efficiencies (`EFFICIENCY_EAGER`, decision 116), fitted on H200 measurements.

Inputs, all measured on one H200 (PyTorch 2.11, bf16; `benchmarks/gpu_session.sh`, docs/costmodel.md "Hopper"), kept in
benchmarks/data/:
- `h200-kernels-llama2-7b.json` (`benchmarks/gpu_kernels.py`): GEMM efficiency by per-GPU size at TP 1-8 (-> `gemm`,
  `gemm_half_flops`), and flex attention at TP 1 and 8 (-> `attn_half_width`);
- `tidal profile` rows of llama2-7b's layer shape (4 layers; two runs, the runtime's default backend on CUDA, flex):
  the FIT set for the attention scale, the memory-bound bytes per token per hidden unit per layer, the per-layer
  constant and the per-document cost (non-negative least squares; `vocab_bytes` is counted, not fitted: the loss
  path's LOGIT_BYTES written and read once);
- `tidal profile` rows of llama3.2-1b (16 layers, hidden 2048, head dim 64, GQA, vocabulary 128K), and of
  llama2-13b's and qwen2.5-7b's layer shapes (4 layers each; hidden 5120, and 3584 with GQA 28/4, FFN 18944 and a
  152K vocabulary): HELD OUT, never fitted on.
Prints the fitted constants and, per profile file, the median and worst |error| per micro-batch of the default
analytic model (calibrated on Hydraulis' A800 pools, carried to the H200 by its datasheet) and of the eager one. The
sdpa rows run another attention kernel than the fit's: they are printed for comparison only.

    python benchmarks/hopper_fit.py
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from tidal.core import ParallelScheme, get_cluster
from tidal.costmodel.analytic import EFFICIENCY_EAGER, AnalyticCostModel, Efficiency
from tidal.costmodel.fitted import read_profile
from tidal.costmodel.memory import LOGIT_BYTES
from tidal.runtime.config import model_arg

DATA = Path(__file__).resolve().parent / "data"
MODEL_7B4 = str(Path(__file__).resolve().parent.parent / "examples" / "model-llama2-7b-4layers.toml")
FIT = (("llama2-7b x4 flex, run 1", MODEL_7B4, "h200-llama2-7b-4layers-profile.csv"),
       ("llama2-7b x4 flex, run 2", MODEL_7B4, "h200-llama2-7b-4layers-profile-flex2.csv"))
EX = Path(__file__).resolve().parent.parent / "examples"
HELD_OUT = (("llama3.2-1b flex (held out)", "llama3.2-1b", "h200-llama3.2-1b-profile-flex.csv"),
            ("llama2-13b x4 flex (held out)", str(EX / "model-llama2-13b-4layers.toml"),
             "h200-llama2-13b-4layers-profile-flex.csv"),
            ("qwen2.5-7b x4 flex (held out)", str(EX / "model-qwen2.5-7b-4layers.toml"),
             "h200-qwen2.5-7b-4layers-profile-flex.csv"))
OTHER = (("llama2-7b x4 sdpa", MODEL_7B4, "h200-llama2-7b-4layers-profile-sdpa.csv"),
         ("llama3.2-1b sdpa", "llama3.2-1b", "h200-llama3.2-1b-profile-sdpa.csv"))
TP1 = ParallelScheme(1, 1, 1)


def kernel_fit() -> Efficiency:
    """GEMM from the TP 1-8 GEMM rows; attention's half width from flex's TP 1 / TP 8 ratio at the longest length."""
    k = json.loads((DATA / "h200-kernels-llama2-7b.json").read_text())
    rows = [r for r in k["attention"] if r["backend"] == "flex"]
    longest = max(r["length"] for r in rows)
    by_tp = {r["tp"]: r for r in rows if r["length"] == longest}
    wide, narrow = by_tp[min(by_tp)], by_tp[max(by_tp)]
    w1, w8, ratio = wide["width"], narrow["width"], wide["flops"] / narrow["flops"]
    half = (w1 * w8 - ratio * w8 * w1) / (ratio * w8 - w1)  # e(w1) / e(w8) = w1 (w8 + k) / (w8 (w1 + k)) = ratio
    return replace(Efficiency(), gemm=k["fit"]["gemm"], gemm_half_flops=k["fit"]["gemm_half_flops"],
                   attn_half_width=half, vocab_bytes=2 * LOGIT_BYTES["bfloat16"])


def features(spec, base: Efficiency, rows):
    """Per row: the measured time less the fixed terms (GEMMs, head, loss bytes), and the columns that the fitted
    constants multiply (1 / attn, elementwise_bytes, launch_per_layer, doc_per_layer)."""
    cluster = get_cluster("h200x1")
    dev = cluster.groups[0].device
    free = AnalyticCostModel(spec, cluster, replace(base, attn=1.0, launch_per_layer=0.0, elementwise_bytes=0.0,
                                                    doc_per_layer=0.0)).coeffs(TP1, dev)
    pair1 = 3 * spec.attn_flops_per_token_pair() / 2 / (dev.peak_flops * base.attn_eff(spec.hidden) / base.attn)
    y, cols = [], []
    for r in rows:
        lens = np.asarray(r.lengths, float)
        attn1 = spec.layers * pair1 * float((lens * lens + lens).sum())  # attention's time at attn = 1
        y.append(r.seconds - (free.mb_time(lens) - attn1))
        cols.append([attn1, spec.layers * spec.hidden * lens.sum() / dev.hbm_bw, spec.layers,
                     spec.layers * len(lens)])
    return np.asarray(y), np.asarray(cols)


def fit() -> Efficiency:
    base = kernel_fit()
    ys, xs = [], []
    for _, model, name in FIT:
        y, x = features(model_arg(model).spec(), base, read_profile(DATA / name))
        ys.append(y)
        xs.append(x)
    theta, _ = nnls(np.vstack(xs), np.concatenate(ys))
    return replace(base, attn=min(1.0, 1.0 / theta[0]) if theta[0] > 0 else 1.0, elementwise_bytes=theta[1],
                   launch_per_layer=theta[2], doc_per_layer=theta[3])


def errors(eff: Efficiency, model: str, name: str) -> list[float]:
    spec = model_arg(model).spec()
    cm = AnalyticCostModel(spec, get_cluster("h200x1"), eff)
    dev = cm.cluster.groups[0].device
    return [cm.coeffs(TP1, dev).mb_time(list(r.lengths)) / r.seconds - 1 for r in read_profile(DATA / name)]


def main() -> None:
    eff = fit()
    print("fitted on the llama2-7b x4 flex rows (GEMM and attention width from the kernel measurements):")
    for f in ("gemm", "gemm_half_flops", "attn", "attn_half_width", "elementwise_bytes", "vocab_bytes",
              "launch_per_layer", "doc_per_layer"):
        print(f"  {f:18} {getattr(eff, f):.4g}   (EFFICIENCY_EAGER: {getattr(EFFICIENCY_EAGER, f):.4g})")
    print(f"\n{'profile':32} {'rows':>4} | {'default analytic':>22} | {'fitted here':>22} | {'EFFICIENCY_EAGER':>22}")
    print(f"{'':32} {'':>4} | {'median   worst  signed':>22} | {'median   worst  signed':>22} | "
          f"{'median   worst  signed':>22}")
    for label, model, name in FIT + HELD_OUT + OTHER:
        cells = []
        for e in (Efficiency(), eff, EFFICIENCY_EAGER):
            err = errors(e, model, name)
            mags = [abs(x) for x in err]
            cells.append(f"{statistics.median(mags):6.1%} {max(mags):7.1%} {statistics.median(err):+7.1%}")
        print(f"{label:32} {len(err):4d} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
