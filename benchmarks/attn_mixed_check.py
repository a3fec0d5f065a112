"""`mixed` and sdpa without cuDNN against flex and sdpa, per micro-batch, from kept H200 `tidal profile` rows
(decision 133; docs/runtime.md "A lent H200, 2026-11-27").

Row sets (benchmarks/data/, one H200, PyTorch 2.11, bf16): `mixed` from the first call of 2026-11-27, flex and sdpa
(cuDNN) from the second, sdpa without cuDNN (`SDPA_CUDA_KERNELS`) from the third, each on a fresh machine of the same
kind. Printed per micro-batch: each backend's seconds and mixed / the faster of flex and sdpa; then the sums and their
ratios. These are repeated micro-batches after a warm-up: they do not show the per-shape cost that new document
lengths bring in training (the training figures are in the session logs, benchmarks/data/gpu-2026-11-27/).

    python benchmarks/attn_mixed_check.py
"""

from __future__ import annotations

from pathlib import Path

from tidal.costmodel.fitted import read_profile

DATA = Path(__file__).resolve().parent / "data"
SETS = {
    "llama2-7b x4": {"mixed": "h200-llama2-7b-4layers-profile-mixed.csv",
                     "flex": "h200-llama2-7b-4layers-profile-flex3.csv",
                     "sdpa": "h200-llama2-7b-4layers-profile-sdpa2.csv",
                     "sdpa no cuDNN": "h200-llama2-7b-4layers-profile-sdpa-nocudnn.csv"},
    "llama3.2-1b": {"mixed": "h200-llama3.2-1b-profile-mixed.csv", "flex": "h200-llama3.2-1b-profile-flex2.csv",
                    "sdpa": "h200-llama3.2-1b-profile-sdpa2.csv"},
}


def compare(name: str, files: dict[str, str]) -> dict[str, float]:
    rows = {b: read_profile(DATA / f) for b, f in files.items()}
    first = next(iter(rows.values()))
    for b, rs in rows.items():
        if [list(r.lengths) for r in rs] != [list(r.lengths) for r in first]:
            raise SystemExit(f"{files[b]} lists other micro-batches than {next(iter(files.values()))}")
    cols = list(rows)
    print(f"\n{name}: {len(first)} micro-batches (seconds, forward + backward)")
    print(f"  {'tokens':>6} {'docs':>4} " + " ".join(f"{c:>13}" for c in cols) + f" {'mixed/best':>10}")
    tot = {c: 0.0 for c in [*cols, "best"]}
    for i, r in enumerate(first):
        t = {c: rows[c][i].seconds for c in cols}
        best = min(t["flex"], t["sdpa"])
        for c in cols:
            tot[c] += t[c]
        tot["best"] += best
        print(f"  {sum(r.lengths):>6} {len(r.lengths):>4} " + " ".join(f"{t[c]:>13.4f}" for c in cols)
              + f" {t['mixed'] / best:>10.3f}")
    ratios = {"mixed / flex": tot["mixed"] / tot["flex"], "mixed / sdpa": tot["mixed"] / tot["sdpa"],
              "mixed / best": tot["mixed"] / tot["best"]}
    if "sdpa no cuDNN" in tot:
        ratios.update({"sdpa no cuDNN / sdpa": tot["sdpa no cuDNN"] / tot["sdpa"],
                       "sdpa no cuDNN / flex": tot["sdpa no cuDNN"] / tot["flex"]})
    print("  sums: " + ", ".join(f"{c} {tot[c]:.3f} s" for c in cols) + "; " + ", ".join(
        f"{k} {v:.3f}" for k, v in ratios.items()))
    return ratios


def main() -> None:
    for name, files in SETS.items():
        compare(name, files)


if __name__ == "__main__":
    main()
