"""Length sources: where the per-document token counts of a training run come from.

Spec strings (see docs/data.md for every parameter and where it comes from):

    synthetic:commoncrawl   seeded lognormal, fitted to two published statistics of RefinedWeb (Hydraulis' CommonCrawl)
    synthetic:github        seeded lognormal, from the size statistics of codeparrot/github-code (Hydraulis' GitHub)
    synthetic:flanv2        seeded three-component mixture after FlexPipe's description of FLANv2
    synthetic:wlb-llm       commoncrawl's body plus a long-document tail sized to WLB-LLM Table 2's imbalance (128K)
    lengths:FILE            `.npy` (1-D integer array) or text with one positive integer per line, in file order

A source is random access (`source[i]`, `source.lengths(start, count)`) and iterable as `(doc_id, length)` pairs.
Synthetic sources are infinite and deterministic in (name, seed): block k of 65536 lengths is drawn from
`numpy.random.default_rng([seed, k])`, so any position can be reproduced without replaying the stream (this is what
makes the sampler resumable in O(1)). File sources are finite; the sampler decides what happens at their end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from tidal.core.errors import TidalError

BLOCK = 65536  # lengths per independently seeded block of a synthetic source
MAX_RAW = 1 << 20  # synthetic draws are clipped to [1, MAX_RAW] tokens (1M; see docs/data.md)


@dataclass(frozen=True)
class Component:
    """One mixture component. kind 'lognormal': median, sigma. kind 'pareto': xmin, alpha, xmax (truncated)."""

    kind: str
    weight: float
    p1: float
    p2: float
    p3: float = 0.0


@dataclass(frozen=True)
class SyntheticSpec:
    name: str
    components: tuple[Component, ...]
    provenance: str


# Parameters and their provenance are documented in docs/data.md; they are approximations, not fits to the datasets.
SYNTHETIC: MappingProxyType[str, SyntheticSpec] = MappingProxyType(
    {
        # RefinedWeb: ~600B tokens over ~968M documents -> mean ~620 tokens; Hydraulis App. A.1: sampling 1.6M tokens
        # (~2,600 docs) per iteration, the longest sequence falls between 15K and 32K (~22K median of the max).
        # Lognormal(median m, sigma s): m*exp(s^2/2) = 620 and m*exp(3.36 s) = 22,000 give m = 260, s = 1.32.
        "commoncrawl": SyntheticSpec(
            "commoncrawl", (Component("lognormal", 1.0, 260.0, 1.32),),
            "RefinedWeb mean ~620 tokens/doc; Hydraulis App. A.1 max-per-1.6M-tokens 15K-32K",
        ),
        # codeparrot/github-code: ~1 TB over ~115M files -> ~8.7 KB/file, ~3.2 bytes/token on code -> mean ~2,700
        # tokens; median file ~3 KB -> ~1,000 tokens. Lognormal m = 1000, s = sqrt(2 ln 2.7) = 1.41. Heavier tail
        # than CommonCrawl, as Hydraulis Fig. 1 shows (more tokens in the >8K ranges).
        "github": SyntheticSpec(
            "github", (Component("lognormal", 1.0, 1000.0, 1.41),),
            "codeparrot/github-code size statistics (1 TB / 115M files), Hydraulis Fig. 1 (heavier tail)",
        ),
        # FLANv2 after FlexPipe §2: mean 51.59 tokens for textual-entailment-like tasks, 977.93 for summarization;
        # 95% of random iterations have max length < 4K and lengths differ by up to ~60K across iterations.
        # 80% short (median 52, s 0.6), 19.98% long-form (median 840, s 0.55 -> mean ~977), 0.02% Pareto tail
        # alpha 1 on [4K, 64K].
        "flanv2": SyntheticSpec(
            "flanv2",
            (
                Component("lognormal", 0.80, 52.0, 0.6),
                Component("lognormal", 0.1998, 840.0, 0.55),
                Component("pareto", 0.0002, 4096.0, 1.0, 65536.0),
            ),
            "FlexPipe §2 (FLANv2): task means 51.59 / 977.93 tokens, 95% of iterations max < 4K, spread up to 60K",
        ),
        # WLB-LLM's internal 128K corpus (wlb-llm.txt): Fig. 3 (line 80) says only that the lengths are highly skewed,
        # most documents short, the longest reaching the full 128K context window; the outliers are "extremely long
        # documents" holding "a small proportion of tokens" (lines 160-162). Assumed shape: commoncrawl's body and a
        # Pareto(alpha 1) tail on [64K, 128K] (half to all of the context window). Its one weight, 0.002 (0.2 % of
        # documents, ~1.3 per 512K-token step), is set so that the original steps' imbalance degree is Table 2's 1.44
        # (line 322; 7B-128K, PP 4, `simulator.wlbstats`, seed 0: 1.433); Table 2's Fixed-Len Greedy rows (1.41 / 1.22
        # / 1.11 / 1.08) are held-out checks (1.354 / 1.176 / 1.088 / 1.045). Meant for 128K contexts.
        "wlb-llm": SyntheticSpec(
            "wlb-llm",
            (
                Component("lognormal", 0.998, 260.0, 1.32),
                Component("pareto", 0.002, 65536.0, 1.0, 131072.0),
            ),
            "WLB-LLM Fig. 3 (skewed, longest = 128K context); tail weight from Table 2's original imbalance 1.44",
        ),
    }
)


def _draw(spec: SyntheticSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    weights = np.array([c.weight for c in spec.components], dtype=np.float64)
    which = rng.choice(len(weights), size=n, p=weights / weights.sum()) if len(weights) > 1 else np.zeros(n, int)
    out = np.empty(n, dtype=np.float64)
    for k, c in enumerate(spec.components):
        m = which == k
        cnt = int(m.sum())
        if c.kind == "lognormal":
            out[m] = c.p1 * np.exp(c.p2 * rng.standard_normal(cnt))
        else:  # truncated Pareto by inverse CDF
            u = rng.random(cnt)
            lo, a, hi = c.p1, c.p2, c.p3
            tail = 1.0 - (lo / hi) ** a
            out[m] = lo / (1.0 - u * tail) ** (1.0 / a)
    return np.clip(np.rint(out), 1, MAX_RAW).astype(np.int64)


class LengthSource:
    """Random-access sequence of document lengths; iterate for `(doc_id, length)` pairs.

    `size` is None for infinite (synthetic) sources. Instances hold only a one-block cache, no shared state."""

    def __init__(self, spec: str, seed: int, size: int | None, data: np.ndarray | None = None,
                 synthetic: SyntheticSpec | None = None) -> None:
        if int(seed) < 0:
            raise TidalError(f"length source {spec!r}: seed must be >= 0, got {seed}")
        self.spec = spec
        self.seed = int(seed)
        self.size = size
        self._data = data
        self._synthetic = synthetic
        self._cache: tuple[int, np.ndarray] | None = None

    def _block(self, k: int) -> np.ndarray:
        if self._cache is None or self._cache[0] != k:
            assert self._synthetic is not None
            self._cache = (k, _draw(self._synthetic, np.random.default_rng([self.seed, k]), BLOCK))
        return self._cache[1]

    def lengths(self, start: int, count: int) -> np.ndarray:
        """Lengths of documents start .. start+count-1 (int64). Raises TidalError past the end of a finite source."""
        if start < 0 or count < 0:
            raise TidalError(f"length source {self.spec}: bad range start={start} count={count}")
        if self._data is not None:
            if start + count > len(self._data):
                raise TidalError(f"length source {self.spec}: range {start}+{count} past its {len(self._data)} docs")
            return self._data[start:start + count].copy()
        parts = []
        i, end = start, start + count
        while i < end:
            k, off = divmod(i, BLOCK)
            take = min(BLOCK - off, end - i)
            parts.append(self._block(k)[off:off + take])
            i += take
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def __getitem__(self, i: int) -> int:
        return int(self.lengths(int(i), 1)[0])

    def __len__(self) -> int:
        if self.size is None:
            raise TypeError(f"length source {self.spec} is infinite")
        return self.size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        i = 0
        while self.size is None or i < self.size:
            chunk = self.lengths(i, BLOCK if self.size is None else min(BLOCK, self.size - i))
            for x in chunk.tolist():
                yield i, x
                i += 1

    def __repr__(self) -> str:
        return f"LengthSource({self.spec!r}, seed={self.seed}, size={self.size})"


def _load_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise TidalError(f"{path}: not a readable .npy array ({str(e).splitlines()[0]})") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1:
        raise TidalError(f"{path}: expected a 1-D array of lengths, got shape {getattr(arr, 'shape', '?')}")
    if arr.dtype.kind not in "iu":
        raise TidalError(f"{path}: expected an integer dtype, got {arr.dtype}")
    if arr.size == 0:
        raise TidalError(f"{path}: empty length file")
    bad = np.flatnonzero(arr <= 0)
    if bad.size:
        raise TidalError(f"{path}: index {int(bad[0])}: length must be a positive integer, got {int(arr[bad[0]])}")
    return arr.astype(np.int64)


def _load_text(path: Path) -> np.ndarray:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise TidalError(f"{path}: not a text file (and not .npy)") from None
    out: list[int] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not s:
            raise TidalError(f"{path}:{n}: empty line; expected one positive integer per line")
        try:
            v = int(s)
        except ValueError:
            raise TidalError(f"{path}:{n}: not an integer: {s[:40]!r}") from None
        if v <= 0:
            raise TidalError(f"{path}:{n}: length must be a positive integer, got {v}")
        out.append(v)
    if not out:
        raise TidalError(f"{path}: empty length file")
    return np.asarray(out, dtype=np.int64)


def load_lengths(path: str | Path) -> np.ndarray:
    """Read a length file (`.npy` or one integer per line). Any defect -> TidalError naming file and line/index."""
    p = Path(path)
    if not p.is_file():
        raise TidalError(f"length file {p} does not exist or is not a file")
    try:
        return _load_npy(p) if p.suffix == ".npy" else _load_text(p)
    except OSError as e:
        raise TidalError(f"cannot read length file {p}: {e.strerror}") from None


def length_source(spec: str, seed: int) -> LengthSource:
    """Parse `synthetic:NAME` or `lengths:FILE` into a LengthSource. `seed` only affects synthetic sources."""
    kind, sep, arg = spec.partition(":")
    if not sep or not arg:
        raise TidalError(f"bad data spec {spec!r}: expected synthetic:NAME or lengths:FILE")
    if kind == "synthetic":
        if arg not in SYNTHETIC:
            raise TidalError(f"unknown synthetic source {arg!r}; choose one of {', '.join(SYNTHETIC)}")
        return LengthSource(spec, seed, None, synthetic=SYNTHETIC[arg])
    if kind == "lengths":
        data = load_lengths(arg)
        return LengthSource(spec, seed, len(data), data=data)
    raise TidalError(f"bad data spec {spec!r}: unknown kind {kind!r}; expected synthetic:NAME or lengths:FILE")
