"""The planner's tuning knobs as one frozen value (issue 27, decision 85).

`PlannerConfig()` holds today's values (each chosen where its decision says); `PlannerConfig.cheap()` is the strategy
proposal's planner (no improvement passes, no jump scan). A config is passed down the call chain (select_step ->
assign -> dispatch / polish / class fill); nothing reads a module global, so a test or a caller changes a knob with
`dataclasses.replace(PlannerConfig(), knob=value)`. Every field is checked in __post_init__ (one-line TidalError).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tidal.core.errors import TidalError

# The improvement passes of select.assign (planner/passes.py), in the one order they run (docs/planner.md opens with it)
PASS_ORDER = ("late_restarts", "shrink", "polish", "next_best", "fill", "class_fill")


@dataclass(frozen=True)
class PlannerConfig:
    # the improvement passes select.assign runs (passes.py, decision 95), by name, in PASS_ORDER (() in the proposal's
    # cheap planner), and the dispatch greedy's jump scan (decision 63)
    passes: tuple[str, ...] = PASS_ORDER
    scan: bool = True
    # dispatch (decision 64): steps with B x D up to restart_max get random-order restarts; the best restart_keep of
    # them (by objective) are packed by assign
    restart_max: int = 1024
    restart_keep: int = 4
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
    # class fill (decision 69)
    class_gap: float = 8e-3  # tried when the plan is above the bound by this factor
    class_per_step: int = 1
    class_rest_left: tuple[int, int, int] = (1, 0, 0)  # the other pipelines' assign: retries, late restarts, fill
    class_min_v: int = 4  # the class's median micro-batch count must be at least this
    class_slacks: tuple[float, ...] = (0.007, 0.01)  # step times tried: the bound times 1 + each
    class_rounds: int = 0  # local-search rounds of the rest's screening dispatch
    class_v: tuple[int, ...] = (0,)  # micro-batch counts tried: the class's median plus each
    class_max_work: int = 2**22  # skipped when documents x bins exceeds this
    class_min_gain: float = 2e-3  # the rest is planned only when the screening promises this factor under the plan
    mode_gap: float = 2e-3  # select_step raises bounds this far under the estimate with bounds_modes.mode_bound

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(v, bool):
                    raise TidalError(f"PlannerConfig.{f.name} must be True or False, got {v!r}")
            elif f.type == "int":
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise TidalError(f"PlannerConfig.{f.name} must be an integer >= 0, got {v!r}")
            elif f.type == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                    raise TidalError(f"PlannerConfig.{f.name} must be a number in [0, 1), got {v!r}")
            else:  # tuples
                if not isinstance(v, tuple) or any(isinstance(x, bool) for x in v):
                    raise TidalError(f"PlannerConfig.{f.name} must be a tuple, got {v!r}")
        if not all(isinstance(x, str) for x in self.passes) or len(set(self.passes)) != len(self.passes) \
                or tuple(x for x in PASS_ORDER if x in self.passes) != self.passes:
            raise TidalError(f"PlannerConfig.passes must be distinct names of {PASS_ORDER} in that order, got "
                             f"{self.passes!r}")
        for name in ("restart_keep", "shrink_rounds", "class_min_v"):
            if getattr(self, name) < 1:
                raise TidalError(f"PlannerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not all(isinstance(x, (int, float)) and 0 < x <= 1 for x in self.shrink_fracs):
            raise TidalError(f"PlannerConfig.shrink_fracs must be fractions in (0, 1], got {self.shrink_fracs!r}")
        if not all(isinstance(x, (int, float)) and 0 <= x < 1 for x in self.class_slacks):
            raise TidalError(f"PlannerConfig.class_slacks must be numbers in [0, 1), got {self.class_slacks!r}")
        if not all(isinstance(x, int) and x >= 0 for x in self.class_v):
            raise TidalError(f"PlannerConfig.class_v must be integers >= 0, got {self.class_v!r}")
        if len(self.class_rest_left) != 3 or not all(isinstance(x, int) and x >= 0 for x in self.class_rest_left):
            raise TidalError(f"PlannerConfig.class_rest_left must be 3 integers >= 0, got {self.class_rest_left!r}")
        if self.late_restart_max_big < self.late_restart_max:
            raise TidalError(f"PlannerConfig.late_restart_max_big ({self.late_restart_max_big}) must be >= "
                             f"late_restart_max ({self.late_restart_max})")

    @classmethod
    def cheap(cls) -> PlannerConfig:
        """The strategy proposal's planner: the first dispatch, its alternatives and packing, no improvement passes
        and no jump scan (a candidate's estimate over many steps, not one step's plan)."""
        return cls(passes=(), scan=False)


DEFAULT = PlannerConfig()
PROPOSAL = PlannerConfig.cheap()
