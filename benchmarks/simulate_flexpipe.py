"""FlexPipe (HBSA, flexpipe.txt §5 Alg. 1) vs the best static PP, simulated on FlexPipe's evaluation set-up.

Set-up (flexpipe.txt §7.1, Table 1): nodes of 4 A100-80GB (NVLink 300 GB/s, IB 50 GB/s); BERT-24 (340M) on 1 node,
BERT-96 (1.36B) on 2, GPT 3.35B on 4, GPT 13B on 8 (§7.2.1); FLANv2-like lengths (synthetic:flanv2); maximum
sequence length 2048, 4096 and 8192; a global batch of 4 context windows of tokens per step. (BERT is costed as a
causal decoder by Tidal's cost model, an approximation.) Systems:
  static-pp  the mapping HBSA picks for the context length (even split, TP = 1, data parallel inside stages), held
  flexpipe   HBSA every step: keep / recompute / grow / shrink, reconfiguration (layer migration) costs charged
  megatron   the best static <TP,PP,CP> x DP (reference)
Memory: FlexPipe's own model of its workloads (tidal.baselines.flexpipe.WorkloadMemory), fitted to its Table
2's peak memory of BERT96 and GPT (3.35B); BERT24 takes BERT96's constants and GPT (13B) GPT (3.35B)'s (per parameter
and per token per layer per hidden unit); --tidal-memory sizes stages with Tidal's memory model instead (under which
BERT96 at 8K fits on one stage).
Reported per cell: tokens/s ratio flexpipe / static-pp and megatron / static-pp, reconfigurations (grow / shrink)
and memory optimisations per 100 steps against the paper's (§5.2: GPT-3.5B on 16 A100s grows or shrinks every 37
iterations, 2.7 per 100, and recomputes every 4, 25 per 100), the stage counts used, the decisions taken, HBSA time
per decision (median, p90) against the paper's 15 ms; then median / p90 / worst over cells. Then Table 2's stage
counts beside the ones HBSA's lines 3-6 give under the fitted memory.

--batch-docs N makes every step N documents of the stream (truncated at the maximum length), FlexPipe's own "global
batch size of 4" (§7.2.1: 4 samples, the step's longest one mu), instead of 4 context windows of tokens: the step's
mu then varies as the paper's does (§2: 95 % of FLANv2 iterations under 4K, §5.2: about 3 % hold long sequences).

--why-no-shrink (with --batch-docs) prints, per Table-2 model and length, the steps where HBSA kept a mapping of more
stages than the step needs, and the median Eq. 1 time of the current mapping, of the best one with fewer stages (the
reconfiguration not counted) and of that reconfiguration: condition B shrinks only when the second plus the third is
below the first.

--paper-setup runs FlexPipe on the workload and cost shape its paper describes: its global batch of 4 samples (as
--batch-docs 4) and a per-stage overhead of every micro-batch operation (`FlexPipePlanner.stage_overhead_s`) fitted
per model so that Eq. 1's time on 8 one-GPU stages over 3 is Fig. 2(c)'s 7.08 / 4.7 s (GPT (3.35B), 3K samples: more
GPUs lose on short samples; the other models are assumed to share that shape), and a memory optimisation that saves
at most Table 2's largest O_plan share of M_peak (25 / 185 GB, 13.5 %: larger overflows reconfigure). Planned and
executed alike, static-pp included; megatron, which Tidal's engine runs without that overhead, is left out. It
prints the fitted overheads, Fig. 2(c)'s times on 1-8 stages, and a reconfiguration's time beside the paper's 0.95 s
(§7.4, GPT (3.35B) adding stages). The paper's 2.7 regrowths per 100 steps are GPT (3.35B) on 16 A100s' (§5.2).

Usage: python benchmarks/simulate_flexpipe.py [--steps 100] [--jobs 2] [--quick] [--tidal-memory] [--batch-docs 4]
       [--why-no-shrink] [--paper-setup] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np
from _simcommon import summary

from tidal.baselines.fixed import pack_fixed
from tidal.baselines.flexpipe import (
    FIG2C,
    TABLE2,
    TABLE2_MEMOPT_SHARE,
    FlexPipePlanner,
    fig2c_times,
    fit_fig2c,
    fit_table2,
)
from tidal.core.cluster import GB, ClusterSpec, DeviceType, NodeGroup
from tidal.core.model import ModelSpec
from tidal.costmodel import AnalyticCostModel
from tidal.data.sampler import LongDocStats, Step, TokenBudgetSampler
from tidal.data.sources import length_source
from tidal.simulator.baselines import UNIT
from tidal.simulator.engine import SimConfig
from tidal.simulator.flexpipe import MICRO_BATCHES, run_flexpipe
from tidal.simulator.systems import Workload, run_system

A100 = DeviceType("a100", 312e12, 80 * GB, 300 * GB, 50 * GB, per_node=4)
MODELS = (
    (ModelSpec("bert-24", 24, 1024, 16, 16, 4096, 30522), 1),
    (ModelSpec("bert-96", 96, 1024, 16, 16, 4096, 30522), 2),
    (ModelSpec("gpt-3.35b", 16, 4096, 32, 32, 16384, 50257), 4),
    (ModelSpec("gpt-13b", 40, 5120, 40, 40, 20480, 50257), 8),
)
LENGTHS = (2048, 4096, 8192)
DATA = "synthetic:flanv2"
FAMILY = {"bert-24": "bert-96", "bert-96": "bert-96", "gpt-3.35b": "gpt-3.35b", "gpt-13b": "gpt-3.35b"}
PAPER_RECONF_PER_100 = 100 / 37  # §5.2: grow or shrink every 37 iterations on average (GPT-3.5B, 16 A100s)
PAPER_MEMOPT_PER_100 = 100 / 4  # §5.2: memory optimisation every 4 iterations


def _cluster(nodes: int) -> ClusterSpec:
    return ClusterSpec(f"a100x{4 * nodes}(4/node)", (NodeGroup(A100, 4 * nodes),))


def workload_memory(model: ModelSpec):
    fam = next(m for m, _ in MODELS if m.name == FAMILY[model.name])
    return fit_table2(fam)


class DocsPerStep:
    """Steps of `n` consecutive documents of a length source, each truncated at `max_len` (FlexPipe's global batch
    of `n` samples, §7.2.1)."""

    def __init__(self, src, n: int, max_len: int) -> None:
        self.src, self.n, self.max_len, self.i = src, n, max_len, 0

    def next_step(self) -> Step:
        lens = tuple(int(x) for x in np.minimum(self.src.lengths(self.i * self.n, self.n), self.max_len))
        ids = tuple(range(self.i * self.n, (self.i + 1) * self.n))
        self.i += 1
        return Step(self.i - 1, ids, lens, ids, (0,) * self.n, LongDocStats())


def stage_overhead(model: ModelSpec, nodes: int, wm) -> float:
    """Fig. 2(c)'s per-stage overhead for `model` (`fit_fig2c`; --paper-setup)."""
    return fit_fig2c(FlexPipePlanner(AnalyticCostModel(model, _cluster(nodes)), fwd_share=SimConfig().fwd_share,
                                     workload_memory=wm))


def cell(args):
    (model, nodes), max_len, steps, tidal_memory, batch_docs, paper, seed = args
    cl = _cluster(nodes)
    wm = None if tidal_memory else workload_memory(model)
    cm = AnalyticCostModel(model, cl)
    delta = stage_overhead(model, nodes, wm) if paper else 0.0
    share = TABLE2_MEMOPT_SHARE if paper else 1.0
    tokens = 4 * max_len

    def source():
        if batch_docs:
            return DocsPerStep(length_source(DATA, seed), batch_docs, max_len)
        return TokenBudgetSampler(length_source(DATA, seed), tokens, max_len, seed=seed)

    w = Workload(cm, max_len, tokens, steps, seed, source, length_source(DATA, seed).lengths(0, 5000))
    sim = SimConfig()
    flex = run_flexpipe(w, sim, None, workload_memory=wm, stage_overhead_s=delta, memopt_share=share)
    static = run_flexpipe(w, sim, None, static=True, name="static-pp", workload_memory=wm, stage_overhead_s=delta,
                          memopt_share=share)
    mega = None if paper else run_system("megatron", w, sim)
    return dict(model=model.name, gpus=4 * nodes, max_len=max_len, flex=flex, static=static, mega=mega)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="BERT96 and GPT (3.35B) only (the models of Table 2)")
    ap.add_argument("--tidal-memory", action="store_true", help="size stages with Tidal's memory model")
    ap.add_argument("--batch-docs", type=int, default=0,
                    help="N documents per step (FlexPipe's global batch of 4 samples) instead of 4 context windows")
    ap.add_argument("--why-no-shrink", action="store_true",
                    help="with --batch-docs: what condition B weighs in the steps where HBSA keeps more stages")
    ap.add_argument("--seed", type=int, default=0, help="data seed")
    ap.add_argument("--why-memopt", default="",
                    help="comma-separated seeds: in the paper's cell (GPT (3.35B), 16 A100s, --paper-setup), how "
                         "often the held mapping overflows and what HBSA does then, and the O_plan share cap's effect")
    ap.add_argument("--paper-setup", action="store_true",
                    help="FlexPipe's batch of 4 samples and Fig. 2(c)'s per-stage overhead")
    a = ap.parse_args()
    if a.paper_setup:
        a.batch_docs = a.batch_docs or 4
    if a.why_no_shrink:
        why_no_shrink(a.steps, a.batch_docs or 4, a.paper_setup)
        return
    if a.why_memopt:
        why_memopt(a.steps, [int(x) for x in a.why_memopt.split(",")])
        return
    models = [m for m in MODELS if m[0].name in TABLE2] if a.quick else list(MODELS)
    with ProcessPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(cell, [(m, ml, a.steps, a.tidal_memory, a.batch_docs, a.paper_setup, a.seed)
                                   for m, ml in itertools.product(models, LENGTHS)]))
    per_step = f"{a.batch_docs} documents" if a.batch_docs else "4 context windows of tokens"
    print(f"FlexPipe vs static PP, {DATA}, seed {a.seed}, {per_step} per step, {a.steps} steps, "
          f"{'Tidal' if a.tidal_memory else 'FlexPipe Table 2'} memory model"
          + (", Fig. 2(c)'s per-stage overhead" if a.paper_setup else ""))
    print(f"{'model':<10}{'GPUs':>5}{'max len':>8}{'flex/static':>12}{'mega/static':>12}{'reconf/100':>11}"
          f"{'memopt/100':>11}{'stages':>8}{'HBSA ms med':>12}{'p90':>9}  decisions | static mapping")
    ratios, rec, mo, ms = [], [], [], []
    for c in cells:
        f, s, m = c["flex"], c["static"], c["mega"]
        r = f.tokens_per_s / s.tokens_per_s
        ratios.append(r)
        rec.append(100 * f.switches / max(1, len(f.steps)))
        mo.append(100 * _count(f.config, "memopt") / max(1, len(f.steps)))
        ms += f.decision_ms
        stages = sorted({st.count(",") + 1 for st in f.strategies})
        mr = f"{m.tokens_per_s / s.tokens_per_s:>12.3f}" if m is not None else f"{'-':>12}"
        print(f"{c['model']:<10}{c['gpus']:>5}{c['max_len']:>8}{r:>12.3f}{mr}"
              f"{rec[-1]:>11.1f}{mo[-1]:>11.1f}{'-'.join(map(str, (stages[0], stages[-1]))):>8}"
              f"{np.median(f.decision_ms):>12.2f}{np.percentile(f.decision_ms, 90):>9.2f}  "
              f"{f.config.split(';')[0]} | {s.strategies[0]}")
    print(f"\nflexpipe / static PP (tokens/s): {summary(ratios)}")
    print(f"reconfigurations (grow/shrink) per 100 steps: {summary(rec)} (paper: {PAPER_RECONF_PER_100:.1f})")
    gpt = [i for i, c in enumerate(cells) if c["model"] == "gpt-3.35b"]
    if gpt:
        print("  GPT (3.35B) on 16 A100s, the paper's cell, at " + " / ".join(str(cells[i]["max_len"]) for i in gpt)
              + ": grow/shrink " + " / ".join(f"{rec[i]:.1f}" for i in gpt) + f" per 100 steps (paper "
              f"{PAPER_RECONF_PER_100:.1f}), memory optimisations " + " / ".join(f"{mo[i]:.1f}" for i in gpt)
              + f" (paper {PAPER_MEMOPT_PER_100:.0f})")
    print(f"memory optimisations per 100 steps: {summary(mo)} (paper: {PAPER_MEMOPT_PER_100:.0f})")
    print(f"HBSA time per decision (ms): median {np.median(ms):.2f}, p90 {np.percentile(ms, 90):.2f}, "
          f"max {np.max(ms):.2f} (paper: 15 ms average)")
    table2_stages()
    if a.paper_setup:
        fig2c(models, a.tidal_memory)


def fig2c(models, tidal_memory: bool) -> None:
    """The fitted per-stage overheads, Eq. 1 on 1-8 one-GPU stages at Fig. 2(c)'s 3K, and a reconfiguration's time."""
    length, g1, t1, g2, t2 = FIG2C
    print(f"\nFig. 2(c) (GPT (3.35B), {length}-token samples, batch 4): paper {t1} s on {g1} GPUs (its fastest), "
          f"{t2} s on {g2} ({t2 / t1:.3f}x); simulated Eq. 1 seconds on 1-8 one-GPU stages with the fitted overhead:")
    for model, nodes in models:
        wm = None if tidal_memory else workload_memory(model)
        pl = FlexPipePlanner(AnalyticCostModel(model, _cluster(nodes)), fwd_share=SimConfig().fwd_share,
                             workload_memory=wm)
        d = fit_fig2c(pl)
        ts = fig2c_times(replace(pl, stage_overhead_s=d), range(1, 9))
        grow = pl.switch_time(pl.even(4), pl.even(5))
        print(f"  {model.name:<10} overhead {d:.3f} s/stage/micro-batch  "
              + " ".join(f"{t:.2f}" for t in ts) + f"  fastest {int(np.argmin(ts)) + 1}, 8/3 {ts[7] / ts[2]:.3f}; "
              f"4 -> 5 stages reconfigures in {grow:.2f} s (paper, GPT (3.35B): 0.95 s)")


def why_no_shrink(steps: int, batch_docs: int, paper: bool = False) -> None:
    """HBSA's decisions on `batch_docs`-sample steps (the simulator's packing), and in the steps it keeps a mapping
    deeper than the step needs: the current mapping's Eq. 1 time, the best shallower one's, its reconfiguration."""
    print(f"HBSA on {batch_docs} documents per step ({DATA}, {steps} steps): steps kept on more stages than needed, "
          "median seconds (Eq. 1)")
    print(f"{'model':<10}{'max len':>8}{'kept deeper':>12}{'current':>9}{'shallower':>10}{'reconfig':>9}  "
          "final mapping")
    for model, nodes in MODELS:
        if model.name not in TABLE2:
            continue
        for max_len in LENGTHS[1:]:
            wm = workload_memory(model)
            pl = FlexPipePlanner(AnalyticCostModel(model, _cluster(nodes)), workload_memory=wm,
                                 stage_overhead_s=stage_overhead(model, nodes, wm) if paper else 0.0,
                                 memopt_share=TABLE2_MEMOPT_SHARE if paper else 1.0)
            src, cur, rows = DocsPerStep(length_source(DATA, 0), batch_docs, max_len), None, []
            for _ in range(steps):
                lens = np.asarray(src.next_step().lengths)
                mu = int(lens.max())
                nm = len(pack_fixed(lens, UNIT, 1, max(mu, -(-int(lens.sum()) // MICRO_BATCHES))).micro_batches)
                s1, s2 = float(lens.sum()) / nm, float(np.sum(lens.astype(np.float64) ** 2)) / nm
                d = pl.decide(mu, s1, s2, nm, cur)
                n = pl.n_stage(mu, s1)
                if cur is not None and d.action == "keep" and n < cur.stages:
                    new, v, _ = pl.search(n, mu, s1, s2, nm, cur)
                    if new is not None:
                        sw = pl.switch_time(cur, new)
                        rows.append((pl.pipeline_time(cur, s1, s2, nm, mu=mu), v - sw, sw))
                cur = d.mapping
            med = np.median(np.array(rows), axis=0) if rows else (np.nan,) * 3
            print(f"{model.name:<10}{max_len:>8}{len(rows):>12}{med[0]:>9.3f}{med[1]:>10.3f}{med[2]:>9.3f}  "
                  f"{cur.layers} x {cur.gpus}")


def memopt_trace(steps: int, seed: int, max_len: int, share: float = TABLE2_MEMOPT_SHARE) -> dict[str, int]:
    """HBSA's decisions in the paper's cell (GPT (3.35B) on 16 A100s, --paper-setup) over `steps` steps of 4
    samples, and for the steps where the held mapping overflows (not condition A): how many recompute (2), how many
    cannot within the O_plan share cap (`share`) and how many find reconfiguring cheaper (not condition D)."""
    model, nodes = next(m for m in MODELS if m[0].name == "gpt-3.35b")
    wm = workload_memory(model)
    pl = FlexPipePlanner(AnalyticCostModel(model, _cluster(nodes)), fwd_share=SimConfig().fwd_share,
                         workload_memory=wm, stage_overhead_s=stage_overhead(model, nodes, wm), memopt_share=share)
    src, cur = DocsPerStep(length_source(DATA, seed), 4, max_len), None
    out = dict.fromkeys(("steps", "overflow", "memopt", "over cap", "not D", "grow", "shrink"), 0)
    for _ in range(steps):
        lens = np.asarray(src.next_step().lengths)
        mu = int(lens.max())
        nm = len(pack_fixed(lens, UNIT, 1, max(mu, -(-int(lens.sum()) // MICRO_BATCHES))).micro_batches)
        s1, s2 = float(lens.sum()) / nm, float(np.sum(lens.astype(np.float64) ** 2)) / nm
        over = cur is not None and not pl.fits(cur, mu, s1)
        capped = over and pl.o_plan(cur, mu, s1) is None
        d = pl.decide(mu, s1, s2, nm, cur)
        out["steps"] += 1
        out["overflow"] += int(over)
        out["over cap"] += int(capped)
        out["not D"] += int(over and not capped and d.action != "memopt")
        out[d.action] = out.get(d.action, 0) + 1
        cur = d.mapping
    return out


def why_memopt(steps: int, seeds: list[int]) -> None:
    """Why memory optimisation is rarer than the paper's 25 per 100 (§5.2): it can only answer a step that the held
    mapping cannot hold (not condition A), and HBSA holds a mapping deep enough for most steps. Per seed and length,
    per 100 steps; then, on the first seed, the O_plan share cap raised from Table 2's."""
    print(f"HBSA in the paper's cell (GPT (3.35B), 16 A100s, 4 samples per step, {DATA}, {steps} steps), per 100 "
          f"steps; paper: memory optimisation {PAPER_MEMOPT_PER_100:.0f}, grow/shrink {PAPER_RECONF_PER_100:.1f}")
    cols = ("overflow", "memopt", "over cap", "not D", "grow", "shrink")
    print(f"{'seed':>5}{'max len':>8}{'share':>7}" + "".join(f"{c:>10}" for c in cols))
    rows = [(sd, ml, TABLE2_MEMOPT_SHARE) for sd in seeds for ml in LENGTHS[1:]]
    rows += [(seeds[0], LENGTHS[1], sh) for sh in (0.25, 0.35, 0.45, 0.6, 1.0)]
    for sd, ml, sh in rows:
        t = memopt_trace(steps, sd, ml, sh)
        print(f"{sd:>5}{ml:>8}{sh:>7.3f}" + "".join(f"{100 * t.get(c, 0) / t['steps']:>10.1f}" for c in cols))


def _count(config: str, action: str) -> int:
    """Decisions of one kind in a run's config text ("HBSA keep 90, memopt 4, ...")."""
    for part in config.split(";")[0].removeprefix("HBSA ").split(", "):
        name, _, n = part.partition(" ")
        if name == action:
            return int(n)
    return 0


def table2_stages() -> None:
    """FlexPipe Table 2's stage counts beside HBSA's fewest stages (lines 3-6) under the fitted memory."""
    print("\nFlexPipe Table 2 (flexpipe.txt §7.3.1) vs HBSA lines 3-6 under the fitted memory model "
          "(paper count: with its O_plan; ours: fewest stages that hold M_peak as is)")
    print(f"{'model':<10}{'mu':>6}{'paper M_peak':>13}{'fit':>6}{'paper stages':>13}{'O_plan GB':>10}{'ours':>6}")
    for model, nodes in MODELS:
        if model.name not in TABLE2:
            continue
        wm = fit_table2(model)
        pl = FlexPipePlanner(AnalyticCostModel(model, _cluster(nodes)), workload_memory=wm)
        for mu, strat, peak, op in TABLE2[model.name]:
            print(f"{model.name:<10}{mu:>6}{peak:>13}{wm.peak(model, mu) / 1e9:>6.0f}{len(strat):>13}"
                  f"{sum(op):>10}{pl.n_stage(mu):>6}")


if __name__ == "__main__":
    main()
