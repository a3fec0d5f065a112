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


def _checked(fn, text: str):
    from tidal.core.errors import TidalError

    try:
        return fn(text)
    except TidalError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def max_len(text: str) -> int:
    """A context length: an integer >= MIN_MAX_LEN (core/limits.py); shorter ones plan for minutes, train noise."""
    from tidal.core.limits import MIN_MAX_LEN, check_lengths

    v = _int_at_least(text, MIN_MAX_LEN, f"an integer >= {MIN_MAX_LEN}")
    return _checked(lambda _t: (check_lengths(v, 1), v)[1], text)


def tokens_per_step(text: str) -> int:
    """Tokens per step: a positive integer whose per-step bookkeeping fits this machine (core/limits.py)."""
    from tidal.core.limits import MIN_MAX_LEN, check_lengths

    v = positive(text)
    return _checked(lambda _t: (check_lengths(MIN_MAX_LEN, v), v)[1], text)


def finite_float(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False):
    """A finite float inside [low, high] (open where asked): `nan` and `inf` are refused."""

    def parse(text: str) -> float:
        from tidal.core.limits import check_finite

        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        return _checked(lambda _t: (check_finite(v, "value", low=low, high=high, low_open=low_open,
                                                 high_open=high_open), v)[1], text)

    return parse
