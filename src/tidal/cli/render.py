"""Rich rendering for the CLI: per-step tables, a progress bar and the run summary."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidal.core.plan import StepPlan

# the width of a console that is not a terminal (a log file, a pipe, torchrun, SLURM): Rich would assume 80 columns
# and cut tables (the demo's loss column, `tidal simulate`'s system names); a log has no width, so tables keep their
# natural width and long lines are not wrapped. COLUMNS in the environment still wins.
LOG_WIDTH = 10_000


def console(stderr: bool = False, file=None, env: Mapping[str, str] = os.environ) -> Console:
    """A Console for the CLI: the terminal's width on a terminal, `LOG_WIDTH` (never cut) otherwise, unless `env`
    sets COLUMNS."""
    con = Console(stderr=stderr, highlight=False, file=file)
    if con.is_terminal or "COLUMNS" in env:
        return con
    return Console(stderr=stderr, highlight=False, file=file, width=LOG_WIDTH)


@contextmanager
def progress(total: int, quiet: bool = False) -> Iterator:
    """Yields `advance()`. The bar goes to stderr and disappears when done."""
    if quiet:
        yield lambda: None
        return
    bar = Progress(TextColumn("planning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task("plan", total=total)
        yield lambda: bar.advance(task)


def save_figure(fig, path) -> None:
    """Lay out, write (one-line error when the path cannot be written) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    from tidal.core.errors import TidalError

    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise TidalError(f"cannot write {path}: {e.strerror}") from None
    finally:
        plt.close(fig)


def _gap(step: StepPlan) -> str:
    return f"{100 * step.gap:.1f}%" if step.lower_bound > 0 else "-"


def step_table(con: Console, index: int, step: StepPlan, sel) -> None:
    """One table per step: pipelines grouped by scheme with estimate and micro-batch imbalance."""
    title = (f"step {index}: {len(step.seq_lengths)} seqs, {sum(step.seq_lengths):,} tokens"
             f"{f', {len(step.deferred)} deferred' if step.deferred else ''} | est {step.est_step_time:.3f}s "
             f"bound {step.lower_bound:.3f}s gap {_gap(step)} | {step.plan_ms:.1f} ms")
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in ("scheme", "pipes", "seqs", "tokens", "mbs", "est max s", "est min s", "mb imb", "cp doc/seq"):
        t.add_column(col, justify="left" if col == "scheme" else "right")
    if sel is None:
        con.print(title + " (nothing to run)")
        return
    groups: dict[str, list[int]] = {}
    for j, r in enumerate(sel.pipelines):
        groups.setdefault(r.scheme, []).append(j)
    for scheme, js in groups.items():
        reps = [sel.pipelines[j] for j in js]
        shard = [m for j in js for m in step.pipelines[j].cp_sharding]
        cps = f"{shard.count('per-doc')}/{shard.count('per-seq')}" if shard else "-"
        t.add_row(scheme, str(len(js)), str(sum(r.sequences for r in reps)), f"{sum(r.tokens for r in reps):,}",
                  str(sum(r.micro_batches for r in reps)), f"{max(r.est_time for r in reps):.3f}",
                  f"{min(r.est_time for r in reps):.3f}", f"{max(r.mb_imbalance for r in reps):.3f}", cps)
    strat = sel.strategies[step.strategy].name
    con.print(t)
    con.print(f"  strategy [{step.strategy}] {strat}   pipeline max/mean {sel.pipeline_imbalance:.3f}   "
              f"rank spread {sel.rank_spread:.3f}")


def summary(con: Console, run) -> None:
    plan = run.plan
    steps = [s for s in plan.steps if s.lower_bound > 0]
    ratios = np.array([s.est_step_time / s.lower_bound for s in steps]) if steps else np.array([1.0])
    ms = np.array([s.plan_ms for s in plan.steps])
    t = Table(title=f"plan: {plan.model} on {plan.cluster}, {len(plan.steps)} steps", title_justify="left",
              show_edge=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    used = np.bincount([s.strategy for s in steps], minlength=len(plan.candidates)) if steps else []
    for i, (name, n) in enumerate(zip(plan.candidates, used)):
        t.add_row(f"candidate [{i}], used in {int(n)} steps", name)
    t.add_row("est step time (mean)", f"{np.mean([s.est_step_time for s in plan.steps]):.3f} s")
    t.add_row("est / lower bound (median, p90, max)",
              f"{np.median(ratios):.4f}, {np.percentile(ratios, 90):.4f}, {ratios.max():.4f}")
    t.add_row("plan time per step (median, max)", f"{np.median(ms):.1f} ms, {ms.max():.1f} ms")
    if str(plan.meta.get("packing", "")).startswith("wlb"):
        t.add_row("mean token delay (steps)", f"{np.mean(run.token_delays):.3f}")
    st = run.long_doc_stats
    if st.get("split_docs") or st.get("truncated_docs"):
        t.add_row("long documents", f"{st['split_docs']} split (+{st['split_extra_seqs']} seqs), "
                                    f"{st['truncated_docs']} truncated ({st['truncated_tokens']:,} tokens cut)")
    con.print(t)


def train_summary(con: Console, rows: list[dict], metrics_path: str = "") -> None:
    """Per-strategy and overall figures of a training run (from its per-step rows)."""
    t = Table(title=f"training: {len(rows)} steps", title_justify="left")
    for c in ("strategy", "steps", "tokens", "mean loss", "critical path s", "wall s", "pull+push share"):
        t.add_column(c, justify="right" if c != "strategy" else "left")
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(r)
    for name, rs in sorted(by.items(), key=lambda kv: -len(kv[1])):
        t.add_row(name, str(len(rs)), f"{sum(r['tokens'] for r in rs):,}", f"{np.mean([r['loss'] for r in rs]):.4f}",
                  f"{sum(r['critical_path_s'] for r in rs):.2f}", f"{sum(r['wall_s'] for r in rs):.2f}",
                  f"{_share(rs):.1%}")
    con.print(t)
    if rows[0].get("attn_backend"):
        picks: dict[str, int] = {}
        for r in rows:
            for b, n in r.get("attn_picks", {}).items():
                picks[b] = picks.get(b, 0) + n
        ran = ", ".join(f"{b} {n}" for b, n in sorted(picks.items(), key=lambda kv: -kv[1]) if n)
        con.print(f"attention backend: {rows[0]['attn_backend']}"
                  + (f"; per micro-batch: {ran} (stage micro-batches, summed over ranks)" if ran else ""))
    tok = sum(r["tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    con.print(f"final loss {rows[-1]['loss']:.4f} | {tok:,} tokens in {wall:.1f} s wall ({tok / wall:,.0f} tok/s) | "
              f"critical path {sum(r['critical_path_s'] for r in rows):.1f} s | pull+push {_share(rows):.1%} of wall"
              + (f" | metrics: {metrics_path}" if metrics_path else ""))


def _share(rows: list[dict]) -> float:
    wall = sum(r["wall_s"] for r in rows)
    return sum(r["pull_s"] + r["push_s"] for r in rows) / wall if wall > 0 else 0.0


def verify_table(con: Console, rows: list[dict], ref_losses: list[float], rep: dict, tol: dict, ok: bool) -> None:
    t = Table(title="distributed vs one process", title_justify="left")
    for c in ("step", "strategy", "docs", "tokens", "loss", "reference loss", "rel. diff"):
        t.add_column(c, justify="right" if c != "strategy" else "left")
    for r, x in zip(rows, ref_losses):
        t.add_row(str(r["step"]), r["strategy"], str(r["documents"]), f"{r['tokens']:,}", f"{r['loss']:.10f}",
                  f"{x:.10f}", f"{abs(r['loss'] - x) / abs(x):.1e}" if x == x else "-")
    con.print(t)
    con.print(f"max relative difference: loss {rep['loss']:.2e} (tol {tol['loss']:.0e}) | parameters "
              f"{rep['params']:.2e} at {rep['params_at']} (tol {tol['params']:.0e}) | Adam moments "
              f"{rep['moments']:.2e} at {rep['moments_at']} (tol {tol['moments']:.0e})")
    con.print("[bold green]PASS[/]" if ok else "[bold red]FAIL[/]")


def demo_table(con: Console, s: dict, static: str) -> None:
    """`tidal demo`: one row per run, then per figure the ratio static / Tidal beside its noise floor (wall time
    first: with one rank per core it is the figure that counts)."""
    t = Table(title=f"Tidal vs best static ({static}): {s['steps']} steps per run, {len(s['rounds'])} rounds, same "
                    f"documents: {s['same_documents']}", title_justify="left")
    for c in ("run", "round", "strategies (steps)", "wall s", "crit. path s", "+comm s", "imbal.", "pull+push",
              "loss"):
        t.add_column(c, justify="left" if c in ("run", "strategies (steps)") else "right", overflow="fold",
                     min_width=11 if c.startswith("strategies") else None)
    for k, rd in enumerate(s["rounds"]):
        for name in ("tidal", "static"):
            r = rd[name]
            t.add_row(name, str(k + 1), r["strategy_steps"].replace("; ", "\n"), f"{r['wall_s']:.1f}",
                      f"{r['critical_path_s']:.2f}", f"{r['process_critical_path_s']:.2f}", f"{r['imbalance']:.2f}",
                      f"{r['pull_push_cpu_share']:.1%}", f"{r['final_loss']:.4f}")
    con.print(t)
    con.print("wall: the timed steps' wall time; crit. path: sum over steps of the slowest rank's CPU time; +comm: the "
              "same with the communication threads' CPU time; pull+push: share of all ranks' CPU time")
    for key, label in (("wall", "wall"), ("critical_path", "critical path"),
                       ("process_critical_path", "with comm. threads")):
        r = s[key]
        noise = "not measured (1 round)" if r["noise"] is None else f"{r['noise']:.1%}"
        con.print(f"{label}: static / Tidal [bold]{r['median']:.3f}x[/] (rounds {r['min']:.3f}-{r['max']:.3f}) | "
                  f"noise floor {noise} | [bold]{r['verdict']}[/]")
    con.print("ratio > 1: Tidal is faster. Noise floor: the largest spread, (max - min) / median, of one strategy's "
              "run totals over the rounds; a ratio closer to 1 than that cannot tell the two apart")
    con.print(f"per-step loss max rel. diff {s['max_loss_rel_diff']:.1e} "
              f"({'agree' if s['loss_agree'] else 'DISAGREE'})")


def profile_table(con: Console, res) -> None:
    """`tidal profile`: the fitted coefficients, fit error and MaxLen per scheme."""
    t = Table(title=f"fitted cost model ({res.time_source}; MaxLen for {res.memory_bytes / 2**30:.1f} GiB per device)")
    cols = ("scheme", "rows", "a (s/tok²)", "b (s/tok)", "c (s/mb)", "d (s/doc)", "rel. RMSE", "act. B/token", "MaxLen")
    for c in cols:
        t.add_column(c, justify="right")
    for sp in res.schemes:
        key = str(sp.scheme)
        f, act = res.model.fits[key], res.activations[key]
        t.add_row(sp.scheme.short(), str(f.rows), f"{f.coeffs.a:.3g}", f"{f.coeffs.b:.3g}", f"{f.coeffs.c:.3g}",
                  f"{f.coeffs.d:.3g}", f"{f.rel_rmse:.1%}", f"{act.m1:,.0f}", f"{f.max_len:,}")
    con.print(t)


def calibration_table(con: Console, stats: dict, title: str) -> None:
    """`tidal report calibration`: |predicted - measured| / measured per step and per pipeline."""
    t = Table(title=title)
    for c in ("level", "n", "median", "p90", "max", "bias (median pred/meas - 1)"):
        t.add_column(c, justify="right")
    for level, n in (("step", stats["steps"]), ("pipeline", stats["pipelines"])):
        s = stats[level]
        t.add_row(level, str(n), f"{s['median']:.1%}", f"{s['p90']:.1%}", f"{s['max']:.1%}", f"{s['bias']:+.1%}")
    for k, s in stats["by_scheme"].items():
        t.add_row(f"  {k}", str(s["n"]), f"{s['median']:.1%}", f"{s['p90']:.1%}", "", "")
    con.print(t)
