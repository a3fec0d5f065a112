"""The planner's tuning knobs as one frozen value (issue 27, decision 85; docs/planner.md, "Configuration"):
`PlannerConfig()` (`DEFAULT`) holds today's values, `PROPOSAL` the strategy proposal's planner; passed down the call
chain, never read from a module global; every field checked in __post_init__ (one-line TidalError).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tidal.core.errors import TidalError

# The improvement passes of select.assign (planner/passes.py), in the one order they run (docs/planner.md opens with it)
PASS_ORDER = ("late_restarts", "shrink", "polish", "fill", "repair", "exchange")
# the knobs that must be > 0 (every other number is >= 0)
_POSITIVE = ("shrink_rounds", "repair_tries", "repair_excess", "exchange_cands", "exchange_partners", "exchange_depth")


@dataclass(frozen=True)
class PlannerConfig:
    # the improvement passes select.assign runs (passes.py, decision 95), by name, in PASS_ORDER (() in the proposal's
    # cheap planner), and the dispatch greedy's jump scan (decision 63)
    passes: tuple[str, ...] = PASS_ORDER
    scan: bool = True
    # dispatch (decision 64): steps with B x D up to restart_max get random-order restarts; the best is an alternative
    restart_max: int = 1024
    hydraulis_trials: int = 1  # shuffles of Hydraulis Alg. 1 that assign also packs (its never-worse guarantee)
    # MaxLen shrink retries (decision 58): fractions tried in turn, the overshoot that triggers them, local-search
    # rounds per retry, the gap to the bound that stops them, retries per select_step
    shrink_fracs: tuple[float, ...] = (0.95, 0.9, 0.85, 0.8)
    shrink_gap: float = 1e-3
    shrink_rounds: int = 5
    shrink_done: float = 1e-3
    shrink_per_step: int = 4
    # late restarts (decisions 59, 65): restart_max < B x D <= late_restart_max gets late_restarts restarts of
    # late_rounds rounds when above the bound by late_gap; up to late_restart_max_big, late_big_restarts with the full
    # local search when above by late_gap_big; on at most late_per_step candidates per select_step
    late_restarts: int = 2
    late_gap: float = 1e-3
    late_per_step: int = 1
    late_restart_max: int = 16384
    late_restart_max_big: int = 2**17
    late_big_restarts: int = 1
    late_gap_big: float = 5e-3
    late_rounds: int = 20
    polish_rounds: int = 40  # decision 60 (0: no polish)
    polish_light: int = 8  # polish's swap partners: this many least-loaded pipelines on steps of > 256 documents
    # single-micro-batch fill (decision 68): filled up to the bound times 1 + fill_slack when above it by fill_gap
    fill_slack: float = 5e-3
    fill_gap: float = 5e-3
    fill_per_step: int = 1
    # the packed plan's repair on one-stage candidates (planner/repair.py, decision 134): on steps with B x D <=
    # repair_max, when above the bound by repair_gap, on at most repair_per_step candidates per select_step; a drop
    # is tried on pipelines over (V - 1) MaxLen by at most repair_excess of MaxLen (repair_drops of them alone, then
    # all at once), with repair_tries document counts each, for at most repair_rounds rounds; the rebalance makes at
    # most repair_moves moves and swaps, swapping with the repair_partners least loaded pipelines
    repair_max: int = 2**18
    repair_gap: float = 2e-3
    repair_per_step: int = 1
    repair_excess: float = 0.02
    repair_drops: int = 1
    repair_tries: int = 3
    repair_rounds: int = 3
    repair_moves: int = 64
    repair_partners: int = 3
    # compound exchanges around the bottleneck on one-stage candidates (planner/exchange.py, decision 136): on steps
    # with B x D <= exchange_max, when above the bound by exchange_gap, on at most exchange_per_step candidates per
    # select_step; at most exchange_moves moves, each over the exchange_cands heaviest documents of the slowest
    # pipeline, the exchange_partners least loaded pipelines able to take one, ejecting at most exchange_eject
    # documents, exchange_depth levels of ejection (1: the ejected documents go where there is room); exchange_max
    # 2^23 (decision 138, was 2^19): every 1024-GPU proposal step of commoncrawl and github, not flanv2's
    exchange_max: int = 2**23
    exchange_gap: float = 2e-3
    exchange_per_step: int = 2
    exchange_moves: int = 16
    exchange_cands: int = 4
    exchange_partners: int = 32
    exchange_eject: int = 3
    exchange_depth: int = 1

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v, lo = getattr(self, f.name), int(f.name in _POSITIVE)
            if f.type == "bool":
                if not isinstance(v, bool):
                    raise TidalError(f"PlannerConfig.{f.name} must be True or False, got {v!r}")
            elif f.type == "int":
                if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                    raise TidalError(f"PlannerConfig.{f.name} must be an integer >= {lo}, got {v!r}")
            elif f.type == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1 or (lo and v == 0):
                    raise TidalError(f"PlannerConfig.{f.name} must be a number in {'(0' if lo else '[0'}, 1), "
                                     f"got {v!r}")
            else:  # tuples
                if not isinstance(v, tuple) or any(isinstance(x, bool) for x in v):
                    raise TidalError(f"PlannerConfig.{f.name} must be a tuple, got {v!r}")
        if not all(isinstance(x, str) for x in self.passes) or len(set(self.passes)) != len(self.passes) \
                or tuple(x for x in PASS_ORDER if x in self.passes) != self.passes:
            raise TidalError(f"PlannerConfig.passes must be distinct names of {PASS_ORDER} in that order, got "
                             f"{self.passes!r}")
        if not all(isinstance(x, (int, float)) and 0 < x <= 1 for x in self.shrink_fracs):
            raise TidalError(f"PlannerConfig.shrink_fracs must be fractions in (0, 1], got {self.shrink_fracs!r}")
        if self.late_restart_max_big < self.late_restart_max:
            raise TidalError(f"PlannerConfig.late_restart_max_big ({self.late_restart_max_big}) must be >= "
                             f"late_restart_max ({self.late_restart_max})")

DEFAULT = PlannerConfig()
# the strategy proposal's planner: the first dispatch, its alternatives and packing, no improvement passes and no jump
# scan (a candidate's estimate over many steps, not one step's plan)
PROPOSAL = PlannerConfig(passes=(), scan=False)
