"""Activation recomputation modes per pipeline stage (no torch): the names the runtime (models/recompute.py), the
memory model (costmodel/memory.py) and the configuration share (docs/decisions.md 90)."""

from __future__ import annotations

from tidal.core.errors import TidalError

MODES = ("none", "full", "selective")


def parse_recompute(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """One mode for every stage ("full") or one per stage ("full,selective,none" or a sequence): stage s runs entry
    s, stages past the list the last entry."""
    parts = tuple(x.strip() for x in value.split(",")) if isinstance(value, str) else tuple(value)
    if not parts:
        raise TidalError("recompute needs at least one mode")
    for m in parts:
        if m not in MODES:
            raise TidalError(f"recompute mode must be one of {', '.join(MODES)}, got {m!r}")
    return parts


def stage_recompute(modes: tuple[str, ...], stage: int) -> str:
    """The mode stage `stage` runs under the per-stage list `modes` (stages past the list: its last entry)."""
    if stage < 0:
        raise TidalError(f"stage must be >= 0, got {stage}")
    return modes[min(stage, len(modes) - 1)]


__all__ = ["MODES", "parse_recompute", "stage_recompute"]
