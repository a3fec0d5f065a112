"""Throughput of the data path: tokenizing and indexing a ~100 MB JSONL corpus, reopening its cached index, and
drawing a step's batch from the index (sampler step + token fetch), against planning time per step.

The corpus is generated locally in a temporary directory (removed at exit unless --keep): the running Python's
standard-library .py files (tests included), cycled until --mb megabytes, one JSON line {"text": ...} per file copy,
each copy prefixed with a comment line naming it. Nothing is downloaded.

    python benchmarks/data_path.py                              # 100 MB, BPE vocab 8192 trained on 16 MB
    python benchmarks/data_path.py --mb 20 --plan-steps 0       # smaller, no planning comparison

Reported: index build (read + JSON parse + tokenize + write .bin/.idx) in tokens/s and MB/s for UTF-8 bytes and for
a byte-level BPE; BPE training time; cached reopen time; per step of one epoch, the sampler's next_step() (what the
planner waits on) and fetching every sequence's tokens from the memory-mapped .bin (what each rank does), median /
p90 / max; and StepPlanner's planning time per step on the same steps, for comparison. The .bin pages were just
written, so fetch times are page-cache hits; a cold first read of a step's tokens costs a disk read of ~2-4 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tidal.data import TokenBudgetSampler
from tidal.data.corpus import StdlibCorpus
from tidal.data.readers import iter_texts
from tidal.data.realcorpus import IndexedCorpus
from tidal.data.tokenize import train_bpe


def make_jsonl(path: Path, mb: float) -> tuple[int, int]:
    """Write about `mb` MB of JSONL from the stdlib sources; returns (documents, bytes of text)."""
    lib = StdlibCorpus(include_tests=True)
    target, docs, text_bytes = int(mb * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        copy = 0
        while fh.tell() < target:
            for rel in lib.paths:
                if fh.tell() >= target:
                    break
                try:
                    body = (lib.root / rel).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                text = f"# copy {copy} of {rel}\n{body}"
                fh.write(json.dumps({"text": text}) + "\n")
                docs += 1
                text_bytes += len(text.encode("utf-8"))
            copy += 1
    return docs, text_bytes


def pct(xs: list[float]) -> str:
    a = np.asarray(xs) * 1e3
    return f"median {np.median(a):.3f} ms, p90 {np.percentile(a, 90):.3f} ms, max {a.max():.3f} ms"


def draw(corpus: IndexedCorpus, tps: int, max_len: int, steps: int | None) -> tuple[list, list[float], list[float]]:
    sampler = TokenBudgetSampler(corpus.length_source(), tps, max_len, seed=0)
    t_step, t_fetch, out = [], [], []
    while steps is None or len(out) < steps:
        t0 = time.perf_counter()
        st = sampler.next_step()
        t1 = time.perf_counter()
        if st is None:
            break
        batch = [corpus.tokens(d, s, n) for d, s, n in zip(st.doc_ids, st.starts, st.lengths)]
        t2 = time.perf_counter()
        assert sum(len(b) - 1 for b in batch) == st.tokens
        t_step.append(t1 - t0)
        t_fetch.append(t2 - t1)
        out.append(st)
    return out, t_step, t_fetch


def plan_times(corpus: IndexedCorpus, args) -> list[float]:
    from tidal.core.cluster import get_cluster
    from tidal.core.model import get_model
    from tidal.costmodel.analytic import AnalyticCostModel
    from tidal.planner.stepper import PlanningOptions, StepPlanner, build_candidates

    cm = AnalyticCostModel(get_model(args.model), get_cluster(args.cluster))
    sample = corpus.length_source().lengths(0, min(len(corpus), 20000))
    cands = build_candidates(cm, "auto", sample, tokens_per_step=args.tokens_per_step, max_len=args.max_len, seed=0)
    sampler = TokenBudgetSampler(corpus.length_source(), args.tokens_per_step, args.max_len, seed=0)
    pl = StepPlanner(cm, cands, sampler, PlanningOptions(max_len=args.max_len, tokens_per_step=args.tokens_per_step,
                                                         packing="hydraulis", seed=0))
    return [ps.plan.plan_ms / 1e3 for ps in pl.steps(args.plan_steps)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=100.0, help="size of the generated JSONL (MB)")
    ap.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary")
    ap.add_argument("--tokenizer-mb", type=float, default=16.0, help="MB of text the BPE is trained on")
    ap.add_argument("--tokens-per-step", type=int, default=524288)
    ap.add_argument("--max-len", type=int, default=32768)
    ap.add_argument("--plan-steps", type=int, default=20, help="steps to plan for the comparison (0: skip)")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--cluster", default="a800x64")
    ap.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    args = ap.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="tidal-data-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        import tokenizers

        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs, "
              f"{platform.machine()}, load average {load:.1f} at start")
        src = work / "corpus.jsonl"
        t0 = time.perf_counter()
        n_docs, n_bytes = make_jsonl(src, args.mb)
        print(f"generated {src}: {src.stat().st_size / 1e6:.1f} MB, {n_docs} documents, {n_bytes / 1e6:.1f} MB of text "
              f"({time.perf_counter() - t0:.1f} s)")
        spec, cache = f"jsonl:{src}", work / "cache"

        results = {}
        for name, tok in (("bytes", None), ("bpe", work / "tokenizer.json")):
            if tok is not None:
                t0 = time.perf_counter()
                bpe = train_bpe(iter_texts(spec, cache, int(args.tokenizer_mb * 1e6)), args.vocab, tok)
                print(f"[bpe] trained byte-level BPE vocab {bpe.vocab} on {args.tokenizer_mb:.0f} MB in "
                      f"{time.perf_counter() - t0:.1f} s")
            t0, c0 = time.perf_counter(), time.process_time()
            c = IndexedCorpus(spec, tokenizer=tok, cache_dir=cache, rebuild=True)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            print(f"[{name}] index build: {c.tokens_total / 1e6:.1f} M tokens, {len(c)} docs in {dt:.2f} s = "
                  f"{c.tokens_total / dt / 1e6:.2f} M tokens/s, {n_bytes / dt / 1e6:.1f} MB/s of text "
                  f"({n_bytes / c.tokens_total:.2f} bytes/token); {cpu:.1f} CPU-s (all threads) = "
                  f"{c.tokens_total / cpu / 1e6:.2f} M tokens per CPU-s; skipped {c.skip_reasons or 0}")
            t0 = time.perf_counter()
            c = IndexedCorpus(spec, tokenizer=tok, cache_dir=cache)
            assert c.cache_status == "hit"
            print(f"[{name}] cached reopen (stat, fingerprint, map .idx/.bin): "
                  f"{(time.perf_counter() - t0) * 1e3:.1f} ms")
            steps, t_step, t_fetch = draw(c, args.tokens_per_step, args.max_len, None)
            print(f"[{name}] one epoch = {len(steps)} steps of <= {args.tokens_per_step} tokens, max_len "
                  f"{args.max_len}, {np.mean([len(s.lengths) for s in steps]):.0f} sequences/step")
            print(f"[{name}]   sampler next_step(): {pct(t_step)}")
            print(f"[{name}]   fetch the step's tokens from the index: {pct(t_fetch)} "
                  f"({args.tokens_per_step / np.median(t_fetch) / 1e6:.0f} M tokens/s)")
            results[name] = c
        if args.plan_steps:
            pt = plan_times(results["bpe"], args)
            print(f"[bpe] StepPlanner per step ({args.model} on {args.cluster}, strategies auto, hydraulis, "
                  f"{len(pt)} steps): {pct(pt)}")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
