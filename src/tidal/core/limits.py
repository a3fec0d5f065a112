"""Sanity limits on run-shaping numbers, shared by `tidal train`, `plan`, `simulate`, `demo` and `verify`: values
outside them are refused with one line before anything runs (docs/training.md, "Bad inputs"; decision 81)."""

from __future__ import annotations

import math
import os

from tidal.core.errors import TidalError

MIN_MAX_LEN = 16  # a shorter max_len splits every document into slivers; planning it takes minutes, training is noise
BYTES_PER_STEP_TOKEN = 24  # the sampler's and planner's per-token arrays (lengths, offsets, ids) for one step
MAX_LR = 1.0  # AdamW moves every element by up to lr per step: lr > 1 destroys any model in a few steps


def host_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_lengths(max_len: int, tokens_per_step: int, what: str = "") -> None:
    """max_len >= MIN_MAX_LEN; tokens_per_step >= 1 and small enough that one step's bookkeeping fits in a quarter of
    this machine's memory."""
    pre = f"{what} " if what else ""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < MIN_MAX_LEN:
        raise TidalError(f"{pre}max_len must be an integer >= {MIN_MAX_LEN}, got {max_len!r}")
    if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int) or tokens_per_step < 1:
        raise TidalError(f"{pre}tokens_per_step must be a positive integer, got {tokens_per_step!r}")
    mem = host_memory_bytes()
    if mem is not None and tokens_per_step * BYTES_PER_STEP_TOKEN > mem // 4:
        raise TidalError(f"{pre}tokens_per_step {tokens_per_step:,} is absurd: one step's bookkeeping alone "
                         f"({tokens_per_step * BYTES_PER_STEP_TOKEN / 2**30:,.0f} GiB) exceeds a quarter of this "
                         f"machine's {mem / 2**30:,.0f} GiB")


def check_finite(value: float, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> None:
    """A finite number inside [low, high] (open ends where asked); one line naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TidalError(f"{name} must be a finite number, got {value!r}")
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
        raise TidalError(f"{name} must be in {lo or '(-inf'}, {hi or 'inf)'}, got {value!r}")
