"""benchmarks/gpu_compile.py (decision 133's follow-up): its random micro-batches, its refusals, and a CPU smoke run
of both modes with torch.compile's `eager` backend (the GPU figures come from `gpu_session.sh OUT compile`)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("gpu_compile", BENCH / "gpu_compile.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_fresh_lengths_fill_the_micro_batch_with_positive_documents():
    mod = _load()
    rng = np.random.default_rng(3)
    for tokens in (1, 7, 512, 16384):
        for _ in range(20):
            lens = mod.fresh_lengths(rng, tokens)
            assert sum(lens) == tokens and min(lens) >= 1


def test_bad_arguments_and_a_cpu_smoke_run():
    r = subprocess.run([sys.executable, "gpu_compile.py", "--fresh", "-1"], cwd=BENCH, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "--fresh must be >= 0" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "gpu_compile.py", "--model", "tiny", "--mbs", "64x2", "--fresh", "2",
                        "--fresh-tokens", "96", "--repeats", "1", "--compile-backend", "eager"], cwd=BENCH,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for mode in ("eager", "compiled"):
        assert f"  {mode:<8} repeated 64x2" in r.stdout
        assert f"  {mode:<8} fresh: 2 micro-batches of 96 tokens" in r.stdout
