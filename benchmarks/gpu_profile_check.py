"""The analytic cost model against a measured GPU profile (`tidal profile` CSV), per micro-batch.

The H200 profile of llama2-7b's layer shape (4 layers, bf16, tp1; `benchmarks/gpu_session.sh` part profile-7b,
measured 2026-11-26) is kept in `benchmarks/data/`. The analytic model was calibrated on Hydraulis' A800 pools and
extrapolates to other GPUs by their datasheet peak FLOP/s and bandwidths (decision 76); this prints its prediction for
each measured micro-batch on the profile's device type, the ratio, and the median and worst |error|.

    python benchmarks/gpu_profile_check.py
    python benchmarks/gpu_profile_check.py --csv profile.csv --model examples/model-llama2-7b-4layers.toml --device h200
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tidal.core import get_cluster
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.fitted import read_profile
from tidal.runtime.config import model_arg

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", default=str(HERE / "data" / "h200-llama2-7b-4layers-profile.csv"))
    ap.add_argument("--model", default=str(HERE.parent / "examples" / "model-llama2-7b-4layers.toml"))
    ap.add_argument("--device", default="h200")
    args = ap.parse_args()
    spec = model_arg(args.model).spec()
    cm = AnalyticCostModel(spec, get_cluster(f"{args.device}x1"))
    device = cm.cluster.groups[0].device
    rows = read_profile(args.csv)
    errs = []
    print(f"{spec.name} on {args.device}: analytic model vs measured forward+backward per micro-batch")
    print(f"{'scheme':>10} {'docs':>5} {'tokens':>7} {'measured ms':>12} {'model ms':>9} {'model/meas':>10}")
    for r in rows:
        scheme = r.scheme
        pred = cm.coeffs(scheme, device).mb_time(list(r.lengths))
        errs.append(pred / r.seconds - 1.0)
        print(f"{str(scheme):>10} {len(r.lengths):5d} {sum(r.lengths):7d} {r.seconds * 1e3:12.1f} {pred * 1e3:9.1f} "
              f"{pred / r.seconds:10.2f}")
    mags = [abs(e) for e in errs]
    print(f"|error|: median {statistics.median(mags):.0%}, worst {max(mags):.0%} over {len(errs)} micro-batches; "
          f"signed median {statistics.median(errs):+.0%}")


if __name__ == "__main__":
    main()
