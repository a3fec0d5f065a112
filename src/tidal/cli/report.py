"""`tidal report calibration METRICS.jsonl [--png PATH] [--cost-model FILE] [--skip N]`: how well the cost model
predicted the measured time of a `tidal train` run, per step and per pipeline (docs/training.md, "Calibration").

Prints the median and p90 of |predicted - measured| / measured as plain lines (and a table per scheme), and writes a
predicted-vs-measured scatter PNG. `--cost-model` re-predicts the same steps with another model (a fitted JSON or
profile CSV, or `analytic`), from the per-pipeline features every row carries (exact: sum_j T_j =
a * sum_sq + b * sum_len + c * micro_batches + d * docs).
"""

from __future__ import annotations

from pathlib import Path

from tidal.core.errors import TidalError


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="reports over a training run's metrics (calibration)", description=__doc__)
    rsub = p.add_subparsers(dest="report", required=True)
    c = rsub.add_parser("calibration", help="predicted vs measured time per step and per pipeline",
                        description=__doc__)
    c.add_argument("metrics", type=Path, help="JSONL metrics of `tidal train`")
    c.add_argument("--png", type=Path, default=None, help="scatter plot (default: METRICS with .png)")
    c.add_argument("--cost-model", default=None,
                   help="re-predict with this model: a fitted JSON / profile CSV, 'analytic' or 'analytic-eager'")
    c.add_argument("--model", default="tiny", help="model preset for --cost-model")
    c.add_argument("--cluster", default="cpux4", help="cluster for --cost-model")
    c.add_argument("--skip", type=int, default=0, help="ignore the first N steps")
    c.set_defaults(func=run_calibration)


def run_calibration(args) -> int:
    from tidal.cli import render
    from tidal.runtime.calibration import calibration_stats, read_metrics, repredict

    if args.skip < 0:
        raise TidalError(f"--skip must be >= 0, got {args.skip}")
    rows = read_metrics(args.metrics)
    label = rows[-1].get("cost_model", "as planned")
    if args.cost_model:
        from tidal.core.cluster import get_cluster
        from tidal.core.model import get_model
        from tidal.costmodel.analytic import AnalyticCostModel, named_efficiency
        from tidal.costmodel.loader import load_cost_model

        spec, cluster = get_model(args.model), get_cluster(args.cluster)
        eff = named_efficiency(args.cost_model)
        cm = AnalyticCostModel(spec, cluster, eff) if eff is not None else load_cost_model(args.cost_model, spec,
                                                                                            cluster)
        rows = repredict(rows, cm)
        label = args.cost_model
    stats = calibration_stats(rows, args.skip)
    for level in ("step", "pipeline"):
        s = stats[level]
        print(f"calibration per {level}: median {s['median']:.4f} p90 {s['p90']:.4f} max {s['max']:.4f} "
              f"bias {s['bias']:+.4f} (n {stats[level + 's']})")
    render.calibration_table(render.console(), stats, f"|predicted - measured| / measured ({label})")
    png = args.png if args.png is not None else args.metrics.with_suffix(".png")
    plot_calibration(rows[args.skip:], png, label)
    print(f"plot: {png}")
    return 0


def plot_calibration(rows: list[dict], path: Path, label: str) -> None:
    """Predicted vs measured seconds, per step (left) and per pipeline coloured by scheme (right), with the
    y = x line and +-5 % / +-10 % bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    steps = [(r["measured_s"], r["predicted_s"]) for r in rows if r["pipelines"]]
    by: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        for q in r["pipelines"]:
            by.setdefault(q["scheme"], []).append((q["measured_s"], q["predicted_s"]))
    panels = ((axes[0], {"step": steps}, "per step (max over pipelines / ranks)"),
              (axes[1], by, "per pipeline"))
    for ax, groups, title in panels:
        pts = [p for v in groups.values() for p in v]
        hi = max([max(p) for p in pts] + [1e-9]) * 1.08
        xs = np.linspace(0, hi, 50)
        ax.plot(xs, xs, color="black", lw=0.8)
        for f, alpha in ((0.05, 0.25), (0.10, 0.12)):
            ax.fill_between(xs, xs * (1 - f), xs * (1 + f), color="tab:blue", alpha=alpha, lw=0)
        for name, v in sorted(groups.items()):
            ax.scatter([p[0] for p in v], [p[1] for p in v], s=12, label=f"{name} ({len(v)})")
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_xlabel("measured s (slowest rank's forward+backward CPU time)", fontsize=8)
        ax.set_ylabel("predicted s", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"calibration: {label} (bands: ±5 %, ±10 %)", fontsize=10)
    from tidal.cli.render import save_figure

    save_figure(fig, path)
