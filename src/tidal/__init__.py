"""Tidal: balance work, not tokens, when training Transformers on variable-length data."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`tidal.Planner` (the library API, docs/library.md), imported on first use so `import tidal` stays light."""
    if name == "Planner":
        from tidal.api import Planner

        return Planner
    raise AttributeError(f"module 'tidal' has no attribute {name!r}")
