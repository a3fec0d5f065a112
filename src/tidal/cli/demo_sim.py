"""`tidal demo`'s simulated section: the speed-up a GPU cluster would see, from Hydraulis' profiled A800s.

Nothing here is measured. The simulator (docs/simulator.md) plans and executes the same steps of a synthetic
CommonCrawl-like length distribution under three systems: the best static Megatron-LM configuration (homogeneous
<TP, PP, CP> over all GPUs, searched), Hydraulis (its Alg. 1 over its own candidates) and Tidal. Plans are made with,
and executed on, Hydraulis' published strategy pool of the model (per-scheme a*s^2 + b*s + c measured by Hydraulis'
authors on A800-80GB nodes: /work/shared/data/hydraulis-profiles, `--cost-model`/`--truth` of `tidal simulate`).

The pools are not shipped with the package (decision 93): they are third-party measurements whose directory states
no licence. Where they are not found (a user's machine), the section runs on Tidal's analytic A800 model instead,
whose efficiencies were calibrated on those pools (decision 76), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# llama2-7b on 16 A800s, Hydraulis Fig. 13's F2 (32K context, 100K tokens per step) on CommonCrawl-like lengths
SCENARIO = {"model": "llama2-7b", "cluster": "a800x16", "pool": "strategy_pool_7b.json",
            "data": "synthetic:commoncrawl", "max_len": 32768, "tokens_per_step": 100_000}
SYSTEMS = ("megatron", "hydraulis", "tidal")
LABELS = {"megatron": "best static (Megatron-LM)", "hydraulis": "Hydraulis", "tidal": "Tidal"}


def default_pools() -> Path:
    """`../shared/data/hydraulis-profiles` beside the repository this source file is in (a checkout's layout)."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "data" / "hydraulis-profiles"


@dataclass(frozen=True)
class SimSection:
    source: str  # what the plans ran on: the pool file, or the analytic model and why
    pooled: bool  # True: Hydraulis' measured pool; False: the analytic fallback
    steps: int
    rows: tuple[tuple[str, str, float, float, float], ...]  # (system, strategies run, mean step s, tokens/s, vs static)


def simulate_section(steps: int, pools: Path | None = None, seed: int = 0) -> SimSection:
    """Plan and simulate `steps` steps of SCENARIO under SYSTEMS (a few seconds)."""
    from tidal.core.cluster import get_cluster
    from tidal.core.model import get_model
    from tidal.costmodel.analytic import AnalyticCostModel
    from tidal.costmodel.loader import load_cost_model
    from tidal.data.sampler import TokenBudgetSampler
    from tidal.data.sources import length_source
    from tidal.simulator.engine import SimConfig
    from tidal.simulator.systems import Workload, run_system, speedups

    sc = SCENARIO
    spec, cluster = get_model(sc["model"]), get_cluster(sc["cluster"])
    pool = (default_pools() if pools is None else pools) / sc["pool"]
    if pool.is_file():
        cm, pooled = load_cost_model(pool, spec, cluster), True
        source = f"Hydraulis' measured A800 strategy pool {pool}, for planning and as the simulated device"
    else:
        cm, pooled = AnalyticCostModel(spec, cluster), False
        source = (f"no Hydraulis pool at {pool}: Tidal's analytic A800 model instead (its efficiencies calibrated on "
                  f"those pools, decision 76), for planning and as the simulated device")
    sample_src = length_source(sc["data"], seed)
    sample = sample_src.lengths(0, 20000)

    def factory():
        return TokenBudgetSampler(length_source(sc["data"], seed), sc["tokens_per_step"], sc["max_len"],
                                  long_docs="split", seed=seed)

    w = Workload(cm, sc["max_len"], sc["tokens_per_step"], steps, seed, factory, sample)
    runs = [run_system(name, w, SimConfig()) for name in SYSTEMS]
    sp = speedups(runs)
    rows = tuple((r.name, strategy_counts(r.strategies), r.mean_step_time, r.tokens_per_s, sp.get(r.name, 0.0))
                 for r in runs)
    return SimSection(source, pooled, steps, rows)


def strategy_counts(labels: list[str]) -> str:
    """'cp2+14*tp1 x3; 2*tp2cp4 x1': each strategy run and on how many steps, most used first."""
    counts: dict[str, int] = {}
    for s in labels:
        counts[s] = counts.get(s, 0) + 1
    return "; ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def print_section(con, sec: SimSection) -> None:
    from rich.table import Table

    sc = SCENARIO
    con.print()
    con.print(f"[bold]SIMULATED, not measured[/]: {sc['model']} on {sc['cluster']} (Hydraulis Fig. 13 F2: max-len "
              f"{sc['max_len']:,}, {sc['tokens_per_step']:,} tokens/step, {sc['data']}), {sec.steps} steps")
    t = Table(title="simulated A800 cluster: the speed-up a GPU cluster would see", title_justify="left")
    for c in ("system", "strategies run (steps)", "step s (sim.)", "tokens/s (sim.)", "vs best static"):
        t.add_column(c, justify="left" if c in ("system", "strategies run (steps)") else "right", overflow="fold")
    for name, strategies, step_s, tps, vs in sec.rows:
        t.add_row(LABELS.get(name, name), strategies, f"{step_s:.3f}", f"{tps:,.0f}", f"{vs:.3f}x")
    con.print(t)
    con.print(f"device: {sec.source}")
    con.print("these figures come from the simulator (docs/simulator.md), not from a GPU: none was used")


__all__ = ["SCENARIO", "SimSection", "default_pools", "print_section", "simulate_section", "strategy_counts"]
