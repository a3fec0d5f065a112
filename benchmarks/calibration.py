"""Calibration of the profiled cost model against real training on this machine (issue 11, "must show").

1. `tidal profile` (tiny, cpux4 with schemes tp1, tp2, tp4, cp2, or cpux2 with tp1, tp2, cp2) unless `--profile FILE`
   reuses one;
2. per corpus (`stdlib`, and a JSONL corpus of real English text: the docstrings of every standard-library module, one
   document per module, written to `--out`), a `tidal train` run of `--steps` steps planned with the profiled model;
   the candidates rotate (step k on candidate k mod 4: 4*tp1, 2*tp2, tp4, 2*cp2) so every scheme is measured;
3. `|predicted - measured| / measured` per step and per pipeline (runtime/calibration.py): for the profiled model
   as planned, and for the analytic model re-predicting the same steps from the rows' features.

    python benchmarks/calibration.py                       # ~10 min on 2 quiet cores
    python benchmarks/calibration.py --profile p.json --steps 20 --corpora stdlib
    python benchmarks/calibration.py --refit --profile-per-corpus     # profile each corpus on its own documents

Measured time is CPU time (the slowest rank's forward + backward), the figure the profile measures, so other
processes on the cores slow the wall clock but not the comparison.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
import time
from pathlib import Path

from tidal.cli.main import main as tidal
from tidal.core import get_cluster, get_model
from tidal.costmodel import AnalyticCostModel
from tidal.runtime.calibration import calibration_stats, read_metrics, repredict

# per cluster: the profiled schemes and the candidates the runs rotate over (every scheme measured)
SETUPS = {"cpux4": ("tp1,tp2,tp4,cp2", "4*tp1;2*tp2;tp4;2*cp2"),
          "cpux2": ("tp1,tp2,cp2", "2*tp1;tp2;cp2")}
CONFIG = """
[model]
name = "tiny"
attn_backend = "sdpa"
[world]
cluster = "{cluster}"
[data]
source = "{source}"
max_len = {max_len}
tokens_per_step = {tokens}
seed = {seed}
[planner]
strategies = "{strategies}"
rotate = true
cost_model = "{cost_model}"
[optimizer]
lr = 2e-3
warmup_steps = 3
decay_steps = {steps}
[train]
steps = {steps}
progress = false
metrics = "{metrics}"
refit = "{refit}"
plan_ahead = {plan_ahead}
overlap_pull = {overlap_pull}
"""


def docstring_corpus(path: Path) -> Path:
    """JSONL, one document per standard-library module: all its docstrings (module, classes, functions)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for f in sorted(lib.rglob("*.py")):
            if "site-packages" in f.parts or "test" in f.parts or "tests" in f.parts:
                continue
            try:
                tree = ast.parse(f.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            docs = [ast.get_docstring(x) for x in ast.walk(tree)
                    if isinstance(x, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            text = "\n\n".join(d for d in docs if d)
            if len(text) >= 64:
                fh.write(json.dumps({"module": str(f.relative_to(lib)), "text": text}) + "\n")
                n += 1
    print(f"# JSONL corpus: {n} modules' docstrings -> {path}", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("calibration-out"))
    ap.add_argument("--profile", type=Path, default=None, help="reuse a fitted model from `tidal profile`")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--tokens-per-step", type=int, default=4096)
    ap.add_argument("--corpora", default="stdlib,jsonl")
    ap.add_argument("--refit", action="store_true", help="also run each corpus with [train] refit = online")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan-ahead", type=int, default=2,
                    help="[train] plan_ahead; 0 plans inline, so no planner process competes with the ranks for cores")
    ap.add_argument("--overlap-pull", action=argparse.BooleanOptionalAction, default=True,
                    help="[train] overlap_pull (--no-overlap-pull: one blocking pull before forward)")
    ap.add_argument("--cluster", choices=sorted(SETUPS), default="cpux4",
                    help="cpux2: one rank per core on a 2-core machine (3 schemes), so ranks do not time-share")
    ap.add_argument("--profile-per-corpus", action="store_true",
                    help="profile each corpus on its own documents (`tidal profile --data`) instead of one synthetic "
                         "profile for both")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    schemes, strategies = SETUPS[args.cluster]
    nproc = get_cluster(args.cluster).num_devices

    def make_profile(out: Path, data: str | None) -> int:
        t0 = time.perf_counter()
        extra = ["--data", data] if data else ["--mixes", "8,32"]
        rc = tidal(["profile", "--model", "tiny", "--cluster", args.cluster, "--schemes", schemes,
                    "--totals", "256,512,1024,2048,4096", *extra, "--max-doc", str(args.max_len),
                    "--seed", str(args.seed), "--out", str(out)])
        print(f"# profile {out.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        return rc

    profile = args.profile
    if profile is None and not args.profile_per_corpus:
        profile = args.out / "profile.json"
        if rc := make_profile(profile, None):
            return rc
    spec, cluster = get_model("tiny"), get_cluster(args.cluster)
    sources = {"stdlib": "stdlib", "jsonl": None}
    results = []
    for name in args.corpora.split(","):
        source = sources[name] or f"jsonl:{docstring_corpus(args.out / 'docstrings.jsonl')}:text"
        if args.profile is None and args.profile_per_corpus:
            profile = args.out / f"profile-{name}.json"
            if rc := make_profile(profile, source):
                return rc
        for refit in (("off", "online") if args.refit else ("off",)):
            metrics = args.out / f"{name}-{refit}.jsonl"
            cfg = args.out / f"{name}-{refit}.toml"
            cfg.write_text(CONFIG.format(source=source, max_len=args.max_len, tokens=args.tokens_per_step,
                                         seed=args.seed, strategies=strategies, cluster=args.cluster,
                                         plan_ahead=args.plan_ahead,
                                         overlap_pull=str(args.overlap_pull).lower(), cost_model=profile,
                                         steps=args.steps, metrics=metrics, refit=refit))
            t0 = time.perf_counter()
            rc = tidal(["train", "--config", str(cfg), "--nproc", str(nproc)])
            if rc:
                return rc
            print(f"# {name} refit={refit}: {args.steps} steps in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            rows = read_metrics(metrics)
            label = "profiled" + (" + online refit" if refit == "online" else "")
            results.append((name, label, calibration_stats(rows), rows))
            if refit == "off":
                ana = calibration_stats(repredict(rows, AnalyticCostModel(spec, cluster)))
                results.append((name, "analytic (same steps)", ana, rows))
    print(f"# |predicted - measured| / measured; tiny, {args.cluster}, {args.steps} steps of {args.tokens_per_step} "
          f"tokens, max_len {args.max_len}, strategies rotating over {strategies}")
    print("| corpus | cost model | steps | step median | step p90 | pipeline median | pipeline p90 | bias | "
          "per scheme median |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, label, s, _ in results:
        per = ", ".join(f"{k.replace('pp1cp1', '').replace('tp1cp2', 'cp2')} {v['median']:.1%}"
                        for k, v in s["by_scheme"].items())
        print(f"| {name} | {label} | {s['steps']} | {s['step']['median']:.1%} | {s['step']['p90']:.1%} | "
              f"{s['pipeline']['median']:.1%} | {s['pipeline']['p90']:.1%} | {s['step']['bias']:+.1%} | {per} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
