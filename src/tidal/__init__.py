"""Tidal: balance work, not tokens, when training Transformers on variable-length data."""

__version__ = "0.1.0"
