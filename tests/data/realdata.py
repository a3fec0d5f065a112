"""Small real-corpus fixtures shared by the data tests: deterministic texts of long-tailed lengths."""

import json
from pathlib import Path

import numpy as np

WORDS = ("def", "class", "return", "the", "data", "token", "planner", "lambda", "über", "naïve", "→", "x", "=", "(",
         ")", ":", "0", "42", "\n", "    ", "import", "numpy", "as", "np", "héllo", "世界")


def texts(n: int, seed: int = 0, median: float = 120.0, sigma: float = 1.2) -> list[str]:
    """`n` texts of lognormal word counts (heavy tail: a few are far longer than the median), with non-ASCII."""
    rng = np.random.default_rng(seed)
    counts = np.maximum(2, np.rint(median * np.exp(sigma * rng.standard_normal(n)))).astype(int)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), c)) for c in counts]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": k, field: t}) + "\n" for k, t in enumerate(docs)), encoding="utf-8")
    return path
