"""Planner worst-case grid (issue 9): per-step plan time (median / p90 / max, CPU and wall) and est / bound (median /
p90 / worst) over models x clusters x candidate sets x length sources x seeds, with a column against Hydraulis'
dispatch followed by the same packer. Run through `python benchmarks/planner.py --grid [--models ...] ...`.

Tuning and held-out (issue 27 item 5): every constant of the planner's passes (decisions 56-69, PlannerConfig) was
chosen on the grid's tuning seeds 0, 1, 2 (steps 0-9 of each; --seeds) of the four tuning sources (commoncrawl,
github, flanv2, heavytail). Each cell also runs on held-out seeds (--held-out-seeds, default 10, 11, 12), and on the
held-out source `stdlib` (--held-out-sources; never tuned on; held-out seeds only): the byte sizes of the running
Python's standard-library files, tests included (data/corpus.StdlibCorpus, `stdlib:tests`), divided by 3.2 bytes per
token (the ratio the github source's provenance uses) and rounded up. Rows say which split they are ("split").

Tokens per step: 200K for <= 64 GPUs, 800K for 256 (the same 3,125 tokens per GPU as 200K on 64 and 3.2M on 1024),
3.2M for 1024. Proposal candidates are computed once per (model, cluster, source) in a run (the DP takes seconds).
"""

from __future__ import annotations

import inspect
import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from tidal.core import TidalError, get_cluster, get_model, parse_strategy, place
from tidal.costmodel import default_cost_model
from tidal.data import sample_steps
from tidal.planner.alg1 import dispatch_hydraulis
from tidal.planner.config import DEFAULT, PASS_ORDER, PlannerConfig
from tidal.planner.packing import pack
from tidal.planner.select import assign, profile_strategies, select_step
from tidal.proof.lp import prove_selection

MAX_LEN = 32768
MODELS = ("llama2-7b", "llama2-13b", "llama-32b")
CLUSTERS = ("a800x16", "a800x32", "a800x64", "a800x256", "a800x1024")
SOURCES = ("commoncrawl", "github", "flanv2", "heavytail")  # the tuning sources
HELD_OUT_SOURCES = ("stdlib",)
TOKENS = {16: 200_000, 32: 200_000, 64: 200_000, 256: 800_000, 1024: 3_200_000}
# Hand lists: 10 templates on 16 GPUs, every count scaled by N / 16. llama-32b needs TP >= 4 (TP 1-2 hold < 100 tokens).
HAND16 = {
    "default": ("2*tp8", "4*tp4", "tp8+2*tp4", "tp8+tp4+2*tp2", "tp8+4*tp2", "tp8cp2", "tp8+tp4+4*tp1", "2*tp4pp2",
                "tp8pp2", "tp4+4*tp2+4*tp1"),
    "llama-32b": ("tp8pp2", "tp8cp2", "2*tp8", "tp8+2*tp4", "4*tp4", "2*tp4pp2", "tp8+tp4pp2", "tp4pp4",
                  "tp4cp2+2*tp4", "tp4pp2+2*tp4"),
}


def hand_list(model: str, n: int) -> list[str]:
    k = n // 16
    out = []
    for t in HAND16.get(model, HAND16["default"]):
        terms = []
        for term in t.split("+"):
            m = re.fullmatch(r"(?:(\d+)\*)?(\w+)", term)
            assert m is not None
            terms.append(f"{int(m.group(1) or 1) * k}*{m.group(2)}")
        out.append("+".join(terms))
    return out


def heavytail_file(tmp: Path) -> str:
    """A heavy-tailed lengths file: Pareto(alpha 1.1, xmin 256) clipped at 256K (split at 32K by the sampler)."""
    rng = np.random.default_rng(2026)
    x = np.clip(256.0 / rng.random(200_000) ** (1 / 1.1), 1, 262_144).astype(np.int64)
    path = tmp / "heavytail.npy"
    np.save(path, x)
    return f"lengths:{path}"


def stdlib_file(tmp: Path) -> str:
    """The held-out source: the standard library's file sizes (bytes, tests included) / 3.2 bytes per token, rounded
    up, in the corpus' file order."""
    from tidal.data.corpus import StdlibCorpus

    src = StdlibCorpus(include_tests=True).length_source()
    x = -(-src.lengths(0, len(src)).astype(np.int64) * 10 // 32)
    path = tmp / "stdlib.npy"
    np.save(path, x)
    return f"lengths:{path}"


class Grid:
    def __init__(self, tmp: Path):
        self.specs = {s: f"synthetic:{s}" for s in SOURCES if s != "heavytail"}
        self.specs["heavytail"] = heavytail_file(tmp)
        self.specs["stdlib"] = stdlib_file(tmp)
        self.cache: dict = {}

    def candidates(self, model: str, cluster: str, how: str, source: str):
        key = (model, cluster, how, source if how == "proposal" else "")
        if key not in self.cache:
            md, cl = get_model(model), get_cluster(cluster)
            cm = default_cost_model(md, cl)
            tokens = TOKENS[cl.num_devices]
            if how == "proposal":
                from tidal.planner.proposal import propose

                lengths = np.concatenate([np.asarray(s.lengths) for s in sample_steps(
                    self.specs[source], seed=99, tokens_per_step=200_000, max_len=MAX_LEN, steps=50)[0]])
                t0 = time.perf_counter()
                try:
                    strats = propose(lengths, cm, tokens_per_step=tokens, max_len=MAX_LEN).strategies
                    names = [str(s) for s in strats]
                except TidalError as e:
                    names, strats = [], ()
                    print(f"  proposal failed for {key}: {e}")
                dt = time.perf_counter() - t0
            else:
                names, dt = hand_list(model, cl.num_devices), 0.0
                strats = [place(parse_strategy(n), cl, md) for n in names]
            profs = profile_strategies(strats, cm) if strats else ()
            self.cache[key] = (names, profs, dt)
        return self.cache[key]


def probe_args(ap, model: str, cluster: str, source: str, seeds: str, steps: str) -> None:
    """The gap probes' common arguments (one grid cell and its steps, as `probe_steps` reads them), with defaults."""
    ap.add_argument("--model", default=model)
    ap.add_argument("--cluster", default=cluster)
    ap.add_argument("--candidates", choices=["proposal", "hand"], default="proposal")
    ap.add_argument("--source", default=source)
    ap.add_argument("--seeds", default=seeds)
    ap.add_argument("--steps", default=steps, help="comma-separated step indices, or N:M for a range")


def probe_steps(model: str, cluster: str, candidates: str, source: str, seeds: str, steps: str):
    """The gap probes' input (gap_probe.py, gap_exact.py): candidate names and profiles of one grid cell, and the
    (seed, step index, lengths) of the steps `steps` names ("0,3" or a range "0:5") for each of `seeds` ("10,11")."""
    try:
        n = int(cluster.split("x")[-1])
        a, _, b = steps.partition(":")
        idx = list(range(int(a), int(b))) if b else [int(x) for x in steps.split(",")]
        seed_list = [int(x) for x in seeds.split(",")]
    except ValueError:
        raise SystemExit(f"error: --cluster like a800x64, --steps like 0,3 or 0:5, --seeds like 10,11; got "
                         f"{cluster!r}, {steps!r}, {seeds!r}") from None
    if n not in TOKENS or not idx or min(idx) < 0:
        raise SystemExit(f"error: --cluster needs one of {sorted(TOKENS)} GPUs and --steps a non-empty list of "
                         f"indices >= 0; got {cluster!r}, {steps!r}")
    with tempfile.TemporaryDirectory() as tmp:
        grid = Grid(Path(tmp))
        if source not in grid.specs:
            raise SystemExit(f"error: unknown --source {source!r}; choose one of {', '.join(sorted(grid.specs))}")
        try:
            names, profs, _ = grid.candidates(model, cluster, candidates, source)
        except TidalError as e:
            raise SystemExit(f"error: {e}") from None
        out = [(seed, k, sample_steps(grid.specs[source], seed=seed, tokens_per_step=TOKENS[n], max_len=MAX_LEN,
                                      steps=max(idx) + 1)[0][k].lengths_array())
               for seed in seed_list for k in idx]
    return names, profs, out


def q(xs, p):
    return float(np.quantile(np.asarray(xs, dtype=np.float64), p)) if len(xs) else float("nan")


def run_cell(grid: Grid, model, cluster, how, source, seeds, steps, hy_trials, budget_ms, prove=False,
             split="tuning", config: PlannerConfig = DEFAULT, milp_s: float = 0.0, pool_s: float = 0.0,
             pool_counts: bool = False, pool_iters: int = 4, forced_s: float = 0.0, forced_kinds: float = 0.0):
    # the proposal of a held-out source is made from its own lengths (seed 99), as for every source
    names, profs, prop_s = grid.candidates(model, cluster, how, source)
    row = {"model": model, "cluster": cluster, "cands": how, "source": source, "split": split,
           "seeds": ",".join(str(s) for s in seeds), "n_cands": len(names), "proposal_s": prop_s, "names": names}
    if not profs:
        row["error"] = "no candidates"
        return row
    tokens = TOKENS[get_cluster(cluster).num_devices]
    kw = {"budget_ms": budget_ms} if budget_ms is not None and "budget_ms" in inspect.signature(
        select_step).parameters else {}
    cpu, wall, ratio, nseq, hy_loss, hy_worst, hy_pairs, hy_step = [], [], [], [], 0, 0.0, 0, []
    plain, proof = [], []  # with prove: est / select_step's own bound, and the proof's CPU ms (not in cpu)
    err, cut = None, 0
    for seed in seeds:
        sts = sample_steps(grid.specs[source], seed=seed, tokens_per_step=tokens, max_len=MAX_LEN, steps=steps)[0]
        for st in sts:
            l_ = st.lengths_array()
            try:
                c0, w0 = time.thread_time(), time.perf_counter()
                sel = select_step(l_, profs, seed=0, config=config, **kw)
                plan = sel.plan
                cut += bool(getattr(sel, "cut_short", False))
                cpu.append((time.thread_time() - c0) * 1e3)
                wall.append((time.perf_counter() - w0) * 1e3)
            except TidalError as e:
                err = str(e)
                continue
            if prove:  # the LP-priced bound (proof.lp.prove_selection), after planning and timed apart
                plain.append(plan.est_step_time / plan.lower_bound if plan.lower_bound > 0 else 1.0)
                c0 = time.thread_time()
                plan = prove_selection(l_, profs, sel, milp_s=milp_s, pool_s=pool_s, pool_counts=pool_counts,
                                       pool_iters=pool_iters, forced_s=forced_s, forced_kinds=forced_kinds).plan
                proof.append((time.thread_time() - c0) * 1e3)
            ratio.append(plan.est_step_time / plan.lower_bound if plan.lower_bound > 0 else 1.0)
            nseq.append(l_.size)
            if hy_trials:
                best_hy = np.inf
                for prof in profs:
                    if int(l_.max()) > prof.max_len:
                        continue
                    ours = assign(l_, prof, seed=0, config=config)[0]
                    hy = _hydraulis(l_, prof, hy_trials)
                    best_hy = min(best_hy, hy)
                    hy_pairs += 1
                    hy_worst = max(hy_worst, ours / hy)
                    if ours > hy * (1 + 1e-9):
                        hy_loss += 1
                hy_step.append(plan.est_step_time / best_hy)
    row.update(steps=len(cpu), seqs=int(np.median(nseq)) if nseq else 0,
               cpu_med=q(cpu, .5), cpu_p90=q(cpu, .9), cpu_max=max(cpu, default=np.nan),
               wall_med=q(wall, .5), wall_p90=q(wall, .9), wall_max=max(wall, default=np.nan),
               r_med=q(ratio, .5), r_p90=q(ratio, .9), r_max=max(ratio, default=np.nan), cut=cut)
    if prove:
        row.update(r_med_plain=q(plain, .5), proof_med=q(proof, .5), proof_p90=q(proof, .9),
                   proof_max=max(proof, default=np.nan), pool_s=pool_s, pool_counts=pool_counts,
                   pool_iters=pool_iters, forced_s=forced_s, forced_kinds=forced_kinds, r_steps=ratio)
    if err and not cpu:
        row["error"] = err
    elif err:
        row["error"] = f"some steps failed: {err}"
    if hy_trials:
        row.update(hy_pairs=hy_pairs, hy_loss=hy_loss, hy_worst=hy_worst, hy_step_med=q(hy_step, .5),
                   hy_step_max=max(hy_step, default=np.nan))
    return row


def _hydraulis(l_, prof, trials):
    d = dispatch_hydraulis(l_, prof.pipes, trials=trials, seed=0)
    est = 0.0
    for g, p in zip(d.groups, prof.pipes):
        if g:
            est = max(est, pack(l_[list(g)], p.coeffs, p.pp, p.max_len).est_time)
    return est


def fmt(row) -> str:
    head = f"| {row['model']} | {row['cluster']} | {row['cands']} | {row['source']} | {row.get('split', 'tuning')} |"
    if "cpu_med" not in row:
        return f"{head} {row.get('error')} |"
    hy = (f" {row['hy_loss']}/{row['hy_pairs']} | {row['hy_worst']:.3f} | {row['hy_step_med']:.3f} |"
          if "hy_pairs" in row else " - | - | - |")
    return (f"{head} {row['n_cands']} | "
            f"{row['seqs']} | {row['cpu_med']:.1f} | {row['cpu_p90']:.1f} | {row['cpu_max']:.1f} | "
            f"{row['wall_med']:.1f} | {row['wall_p90']:.1f} | {row['wall_max']:.1f} | {row['r_med']:.4f} | "
            f"{row['r_p90']:.4f} | {row['r_max']:.4f} |{hy}"
            + (f" cut short: {row['cut']}/{row['steps']} |" if row.get("cut") else "")
            + (f" proved: est/lb med {row['r_med']:.4f} (select_step's {row['r_med_plain']:.4f}), proof cpu ms med "
               f"{row['proof_med']:.1f} p90 {row['proof_p90']:.1f} max {row['proof_max']:.1f} |" if "proof_med" in row
               else "")
            + (f" {row['error']}" if row.get("error") else ""))


HEADER = ("| model | cluster | cands | source | split | #c | seqs | cpu med | cpu p90 | cpu max | wall med | wall p90 "
          "| wall max | est/lb med | est/lb p90 | est/lb max | lose vs hy | ours/hy worst | step est/hy med |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def warm_kernels() -> float:
    """Load the compiled planner loops (planner/kernels.py and kernels_pack.py, when numba is installed) once per
    process, so that no cell's first step pays for it. Returns the seconds it took (a one-off of a planning process,
    reported apart)."""
    from tidal.planner.bounds import PipeCost, top_docs_bound
    from tidal.planner.dispatch import dispatch

    t0 = time.perf_counter()
    pipes = [PipeCost(1e-3, 1.0, 0.5, 2, 64), PipeCost(1e-3, 1.0, 0.5, 1, 64)]
    lengths = np.array([3, 5, 7, 9, 11, 13], dtype=np.int64)
    dispatch(lengths, pipes)
    dispatch_hydraulis(lengths, pipes, trials=1)
    dispatch_hydraulis(lengths, [pipes[1]] * 64, trials=1)  # its class trial (alg1.CLASS_MIN pipelines or more)
    pack(lengths, pipes[0].coeffs, 2, 64)
    pack(np.full(8, 60), pipes[0].coeffs, 2, 64)  # >= 8 micro-batches: the packer's search runs
    top_docs_bound(lengths, pipes)
    from tidal.planner import kernels_batch  # pack_groups' batched packer

    z = np.zeros(1)
    kernels_batch.loops().pack_many(lengths, np.array([0, lengths.size]), z + 1e-3, z + 1.0, z, z + 0.5, z,
                                    np.array([64]), np.array([int(lengths.sum())]), np.array([1]))
    return time.perf_counter() - t0


def _seeds(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TidalError(f"{flag} takes comma-separated integers, got {text!r}") from None


def splits(args) -> list[tuple[str, list[int], list[str]]]:
    """(split, seeds, sources): the tuning seeds on the tuning sources given, then the held-out seeds on those and on
    the held-out sources; a split with no seeds is left out."""
    tuned = [x for x in args.sources.split(",") if x]
    out = []
    if seeds := _seeds(args.seeds, "--seeds"):
        out.append(("tuning", seeds, tuned))
    if held := _seeds(getattr(args, "held_out_seeds", ""), "--held-out-seeds"):
        out.append(("held-out", held, tuned + [x for x in getattr(args, "held_out_sources", "").split(",") if x]))
    if not out:
        raise TidalError("no seeds: give --seeds, --held-out-seeds or both")
    return out


def config_of(args) -> PlannerConfig:
    """The planner config of --passes (names, or 'all', or 'none') less --drop (names): the ablation of decision 95."""
    spec = getattr(args, "passes", "all")
    keep = PASS_ORDER if spec == "all" else () if spec == "none" else tuple(x for x in spec.split(",") if x)
    drop = {x for x in getattr(args, "drop", "").split(",") if x}
    unknown = (set(keep) | drop) - set(PASS_ORDER)
    if unknown:
        raise TidalError(f"unknown pass(es) {sorted(unknown)}; the passes are {', '.join(PASS_ORDER)}")
    return PlannerConfig(passes=tuple(x for x in PASS_ORDER if x in keep and x not in drop))


def main(args) -> None:
    rows = []
    config = config_of(args)
    with tempfile.TemporaryDirectory() as tmp:
        grid = Grid(Path(tmp))
        print(f"grid: steps/seed {args.steps}, splits {[(n, sd, src) for n, sd, src in splits(args)]}, hydraulis "
              f"trials {args.hy_trials}, budget {args.budget_ms} ms, passes {','.join(config.passes) or 'none'}; "
              f"times in ms per step (cpu = thread_time); "
              f"compiled planner loops loaded in {warm_kernels():.2f} s (once per process, not in any step)")
        print(HEADER)
        for model in args.models.split(","):
            for cluster in args.clusters.split(","):
                for how in args.cands.split(","):
                    for split, seeds, sources in splits(args):
                        for source in sources:
                            trials = args.hy_trials if get_cluster(cluster).num_devices <= args.hy_max_devices else 0
                            row = run_cell(grid, model, cluster, how, source, seeds, args.steps, trials,
                                           args.budget_ms, args.prove, split, config,
                                           getattr(args, "prove_milp", 0.0), getattr(args, "prove_pool", 0.0),
                                           getattr(args, "pool_counts", False), getattr(args, "pool_halvings", 4),
                                           getattr(args, "prove_forced", 0.0), getattr(args, "forced_kinds", 0.0))
                            rows.append(row)
                            print(fmt(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=float))
    summary(rows)


def summary(rows) -> None:
    for split in ("tuning", "held-out"):
        ok = [r for r in rows if "cpu_med" in r and r.get("split", "tuning") == split]
        if not ok:
            continue
        print(f"\n{split} (seeds {'; '.join(sorted({r.get('seeds', '?') for r in ok}))}; sources "
              f"{', '.join(sorted({r['source'] for r in ok}))})")
        print("| GPUs | cells | worst cpu p90 ms (cell) | worst wall p90 ms | median est/lb (all cells' medians) "
              "| worst cell est/lb med | worst cell est/lb p90 | worst step est/lb |")
        print("|---|---|---|---|---|---|---|---|")
        for n in sorted({get_cluster(r["cluster"]).num_devices for r in ok}):
            rs = [r for r in ok if get_cluster(r["cluster"]).num_devices == n]
            w = max(rs, key=lambda r: r["cpu_p90"])
            print(f"| {n} | {len(rs)} | {w['cpu_p90']:.1f} ({w['model']} {w['cands']} {w['source']}) | "
                  f"{max(r['wall_p90'] for r in rs):.1f} | {np.median([r['r_med'] for r in rs]):.4f} | "
                  f"{max(r['r_med'] for r in rs):.4f} | {max(r.get('r_p90', np.nan) for r in rs):.4f} | "
                  f"{max(r['r_max'] for r in rs):.4f} |")
        for how in ("proposal", "hand"):
            rs = [r["r_med"] for r in ok if r["cands"] == how]
            if rs:
                print(f"{how}: median over cells of the median est/lb {np.median(rs):.4f}, cells with median <= 1.01: "
                      f"{sum(x <= 1.01 for x in rs)}/{len(rs)}")
        hy = [r for r in ok if "hy_pairs" in r]
        if hy:
            print(f"vs dispatch_hydraulis + same packer: {sum(r['hy_loss'] for r in hy)} losses over "
                  f"{sum(r['hy_pairs'] for r in hy)} (step, candidate) pairs; worst ours/hydraulis "
                  f"{max(r['hy_worst'] for r in hy):.4f}; per step, best plan / best Hydraulis plan over candidates: "
                  f"median of cell medians {np.median([r['hy_step_med'] for r in hy]):.3f}")


def load_rows(path: str) -> list[dict]:
    """Rows of a --out JSON file, or of the printed table (a saved stdout; several files joined by ',')."""
    rows = []
    for one in path.split(","):
        text = Path(one).read_text()
        if one.endswith(".json"):
            rows += json.loads(text)
            continue
        for line in text.splitlines():
            f = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(f) < 5 or f[0] not in MODELS:
                continue
            split = f[4] in ("tuning", "held-out")  # this table's format, else the one before the split column
            keys = ("n_cands", "seqs", "cpu_med", "cpu_p90", "cpu_max", "wall_med", "wall_p90", "wall_max", "r_med",
                    "r_p90", "r_max") if split else ("n_cands", "seqs", "cpu_med", "cpu_p90", "cpu_max", "wall_med",
                                                     "wall_p90", "wall_max", "r_med", "r_max")
            k0 = 5 if split else 4
            r = dict(model=f[0], cluster=f[1], cands=f[2], source=f[3], split=f[4] if split else "tuning")
            try:
                r.update({k: float(v) for k, v in zip(keys, f[k0:k0 + len(keys)])})
            except (ValueError, IndexError):
                r["error"] = f[k0]
                rows.append(r)
                continue
            h = k0 + len(keys)
            tail = " ".join(x for x in f[h + 3:] if x)
            if "failed" in tail:
                r["error"] = tail
            if f[h] != "-":
                lost, pairs = f[h].split("/")
                r.update(hy_loss=int(lost), hy_pairs=int(pairs), hy_worst=float(f[h + 1]), hy_step_med=float(f[h + 2]))
            rows.append(r)
    return rows


def compare(before_path: str, after_path: str) -> None:
    """Merged before/after table of two grid outputs (python benchmarks/planner_grid.py BEFORE AFTER; each a --out
    JSON file or a saved stdout, several joined by ',')."""
    def key(r):
        return r["model"], r["cluster"], r["cands"], r["source"], r.get("split", "tuning")

    before = {key(r): r for r in load_rows(before_path)}
    after = list({key(r): r for r in load_rows(after_path)}.values())
    print("| model | cluster | cands | source | seqs | cpu p90 ms before -> after | cpu max before -> after "
          "| wall p90 after | est/lb med before -> after | est/lb max before -> after | lose vs hy (after) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worse = []
    for r in after:
        b = before.get(key(r), {})
        if "cpu_p90" not in r or "cpu_p90" not in b:
            print(f"| {r['model']} | {r['cluster']} | {r['cands']} | {r['source']} | before: {b.get('error', '-')} "
                  f"| after: {r.get('error', 'ok')} |")
            continue
        if r["r_med"] > b["r_med"] + 1e-4:
            worse.append((*key(r), b["r_med"], r["r_med"]))
        hy = f"{r['hy_loss']}/{r['hy_pairs']}" if "hy_pairs" in r else "-"
        print(f"| {r['model']} | {r['cluster']} | {r['cands']} | {r['source']} | {r['seqs']:.0f} | "
              f"{b['cpu_p90']:.1f} -> "
              f"{r['cpu_p90']:.1f} | {b['cpu_max']:.1f} -> {r['cpu_max']:.1f} | {r['wall_p90']:.1f} | "
              f"{b['r_med']:.4f} -> {r['r_med']:.4f} | {b['r_max']:.4f} -> {r['r_max']:.4f} | {hy} |"
              + (" before: some steps failed (no candidate held the step's longest sequence) |"
                 if "failed" in str(b.get("error", "")) else ""))
    print(f"\ncells whose median est/lb got worse by > 1e-4: {len(worse)}")
    for w in worse:
        print("  ", w)
    done = {key(r)[:4] for r in after if "cpu_p90" in r}
    had = {k[:4] for k, r in before.items() if "cpu_p90" in r}
    for name, got in (("after", done), ("before", had)):
        miss = [k for k in ((m, c, h, src) for m in MODELS for c in CLUSTERS for h in ("proposal", "hand")
                            for src in SOURCES) if k not in got]
        print(f"\ncells not run ({name}): {len(miss)}" + (": " + "; ".join(" ".join(k) for k in miss) if miss else ""))
    print("\nbefore:")
    summary(list(before.values()))
    print("\nafter:")
    summary(after)


if __name__ == "__main__":
    import sys

    compare(sys.argv[1], sys.argv[2])
