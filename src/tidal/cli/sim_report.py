"""`tidal simulate --report DIR`: PNG charts (matplotlib, Agg) and a self-contained index.html that embeds them.

Charts: step time per system over the steps; a per-device Gantt timeline of one step; the rank-latency spread of each
system (Hydraulis Fig. 15b); the strategy chosen per step (Fig. 15a). index.html inlines every PNG as a data URI and
marks itself `data-charts-loaded="K"` once K images have decoded, which the headless-browser test reads.
"""

from __future__ import annotations

import base64
import html
from collections import Counter
from pathlib import Path

import numpy as np

from tidal.core.errors import TidalError

CHARTS = ("step_time", "gantt", "rank_spread", "strategy")
MAX_GANTT_ROWS = 48


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def chart_step_time(runs, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in runs:
        ax.plot(range(len(r.step_times)), r.step_times, marker=".", label=f"{r.name} (mean {r.mean_step_time:.3f}s)")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_xlabel("step")
    ax.set_ylabel("simulated step time (s)")
    ax.set_title("Step time per system")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gantt_rows(result, max_rows: int = MAX_GANTT_ROWS) -> list[tuple[str, list[tuple[float, float, int]]]]:
    """(label, intervals) of one device per pipeline stage, in pipeline order, at most `max_rows` rows."""
    rows = []
    seen: set[int] = set()
    for j, p in enumerate(result.pipelines):
        n = p.tp * p.cp
        for s in range(p.pp):
            d = p.devices[s * n]
            if d in seen or not p.micro_batches:
                continue
            seen.add(d)
            rows.append((f"d{d} p{j} {p.tp}/{p.pp}/{p.cp} s{s}", result.device_intervals(d)))
            if len(rows) >= max_rows:
                return rows
    return rows


def chart_gantt(run, step: int, path: Path) -> None:
    plt = _plt()
    res = run.steps[step]
    rows = gantt_rows(res)
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.22 * len(rows) + 1.2)))
    for y, (_, iv) in enumerate(rows):
        for kind, color in ((0, "tab:blue"), (1, "tab:orange")):
            bars = [(a, b - a) for a, b, k in iv if k == kind]
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
    ax.axvline(res.compute_time, color="k", ls="--", lw=0.8)
    ax.axvline(res.step_time, color="r", ls=":", lw=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time in step (s); blue forward, orange backward; dashed: last backward, dotted: step end")
    ax.set_title(f"{run.name}, step {step}: one device per pipeline stage ({run.strategies[step][:70]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_rank_spread(runs, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    data = []
    for r in runs:
        spreads = []
        for res in r.steps:
            lat = res.pipeline_latencies()
            spreads.append(float((lat.max() - lat.min()) / lat.max()) if lat.size and lat.max() > 0 else 0.0)
        data.append(spreads)
    ax.boxplot(data, showmeans=True)
    ax.set_xticks(range(1, len(runs) + 1), [r.name for r in runs])
    ax.set_ylabel("(max - min) / max pipeline latency per step")
    ax.set_title("Rank-latency spread (Hydraulis Fig. 15b)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_strategy(runs, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.6 + 1.4 * len(runs)), squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        names = list(dict.fromkeys(r.strategies))
        y = [names.index(s) for s in r.strategies]
        ax.step(range(len(y)), y, where="mid", color="tab:green")
        ax.scatter(range(len(y)), y, s=10, color="tab:green")
        ax.set_yticks(range(len(names)), [n[:48] for n in names], fontsize=6)
        ax.set_ylim(-0.5, len(names) - 0.5)
        ax.set_title(f"{r.name}: {len(names)} strategies, {r.switches} switches", fontsize=8)
        ax.xaxis.set_major_locator(_integer_ticks())
    axes[-1, 0].set_xlabel("step")
    fig.suptitle("Strategy chosen per step (Hydraulis Fig. 15a)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chosen(run, top: int = 4) -> str:
    """The strategies a system ran, most used first, with their step counts ("2*tp2cp2 x12; tp2+6*tp1 x8"); not
    its candidates (run.config)."""
    counts = Counter(run.strategies).most_common()
    text = "; ".join(f"{s} x{n}" for s, n in counts[:top])
    return text + (f"; +{len(counts) - top} more" if len(counts) > top else "")


def table_rows(runs, speedup: dict[str, float]) -> list[tuple[str, ...]]:
    return [(r.name, f"{r.mean_step_time:.4f}", f"{r.tokens_per_s:,.0f}",
             f"{speedup[r.name]:.3f}x" if r.name in speedup else "-", str(len(r.steps)), str(r.switches),
             f"{r.plan_s:.2f}", f"{r.sim_s:.2f}", chosen(r), r.config) for r in runs]


HEADER = ("system", "mean step (s)", "tokens/s", "vs best static", "steps", "switches", "plan (s)", "sim (s)",
          "strategies run (steps)", "config (candidates)")


def write_report(out: Path, runs, speedup: dict[str, float], title: str, gantt_system: str | None = None,
                 gantt_step: int | None = None) -> list[Path]:
    """Write the PNGs and index.html into `out`; returns the written paths."""
    if not runs:
        raise TidalError("nothing to report: no system ran")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TidalError(f"cannot create report directory {out}: {e.strerror}") from None
    g = next((r for r in runs if r.name == gantt_system), None) or next((r for r in runs if r.name == "tidal"),
                                                                        runs[-1])
    if not g.steps:
        raise TidalError(f"system {g.name} ran no step")
    k = gantt_step if gantt_step is not None else int(np.argmax(g.step_times))
    k = min(max(0, k), len(g.steps) - 1)
    paths = {c: out / f"{c}.png" for c in CHARTS}
    chart_step_time(runs, paths["step_time"])
    chart_gantt(g, k, paths["gantt"])
    chart_rank_spread(runs, paths["rank_spread"])
    chart_strategy(runs, paths["strategy"])
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in table_rows(runs, speedup))
    imgs = "".join(
        f'<figure><img id="chart-{c}" alt="{c}" src="data:image/png;base64,'
        f'{base64.b64encode(paths[c].read_bytes()).decode()}"><figcaption>{c}.png</figcaption></figure>'
        for c in CHARTS)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}} img{{max-width:100%}}</style></head>
<body data-charts-loaded="0"><h1>{html.escape(title)}</h1>
<table><tr>{''.join(f'<th>{h}</th>' for h in HEADER)}</tr>{rows}</table>
{imgs}
<script>
function countCharts() {{
  const imgs = Array.from(document.querySelectorAll('img[id^="chart-"]'));
  const n = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.chartsLoaded = String(n);
}}
window.addEventListener('load', countCharts);
</script></body></html>
"""
    (out / "index.html").write_text(page)
    return [*paths.values(), out / "index.html"]
