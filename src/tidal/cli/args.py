"""argparse value types the subcommands share: a bad value is one usage line, not a traceback."""

from __future__ import annotations

import argparse


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    return v


def positive(text: str) -> int:
    """An integer >= 1 (lengths, token budgets, step counts)."""
    return _int_at_least(text, 1, "a positive integer")


def seed(text: str) -> int:
    """A seed: an integer >= 0 (numpy's generators take no negative seeds)."""
    return _int_at_least(text, 0, "a non-negative integer seed")


def positive_seconds(text: str) -> float:
    """A finite duration in seconds > 0 (timeouts; `inf` and `nan` are refused)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {v:g}")
    return v
