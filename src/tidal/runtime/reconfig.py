"""Live reconfiguration between steps (FlexPipe §4 in Tidal's executor; decision 91).

The executor already switches strategy per step: every step pulls each stage's 16-bit parameters from the fixed,
fully sharded master layout, and no optimizer state ever moves. A reconfiguration (a step whose candidate differs from
the step before) therefore needs no suspend, no checkpoint and no extra message: the layers whose holder changed
arrive in the same pull, from the same owners, at the same bytes as any step's pull of them.

What this module measures, per rank and step (:func:`reconfig_stats`, reported as `StepMetrics.reconfig`):

- *moved groups*: parameter groups (the embedding, each layer, norm + head) this rank holds now with a different
  box than in the previous step (another layer, another TP shard, or none before); a group held with the same box
  is unchanged (:func:`moved_groups`, pure);
- *moved bytes*: what this rank receives for its moved groups, against those groups' parameter bytes in the compute
  dtype (its held boxes): at most 1.0, since the pull plans are at the minimum (decision 74) and rows a rank owns
  itself do not travel;
- *extra bytes*: this rank's pull bytes (sent + received) under the new candidate less those of the previous one:
  what the reconfiguration adds to a step that had kept the old strategy (can be negative).

Why an unchanged layer is still pulled (the issue's "only moved layers re-pulled"): the masters change at every
optimizer step, so a compute-dtype copy kept from the previous step is stale (the verify would fail); an unchanged
layer's pull is the step's parameter refresh, which a step without reconfiguration pays too. For the same reason the
pull cannot overlap the previous step (FlexPipe Fig. 6): step t + 1's parameters exist only after step t's update.
It overlaps the step's own forward instead (the pull window, decision 75).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidal.baselines.flexpipe import FlexPipePlanner
from tidal.baselines.flexpipe_steps import FlexPipeStepPlanner
from tidal.costmodel.memory import MemoryConfig
from tidal.runtime.planahead import StreamInputs

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ReconfigStats:
    reconfigured: bool = False  # the candidate differs from the previous step's
    moved_groups: int = 0
    moved_recv_bytes: int = 0  # received by this rank for its moved groups
    moved_param_bytes: int = 0  # the moved groups' held parameter bytes in the compute dtype
    extra_bytes: int = 0  # this rank's pull bytes under the new candidate less under the previous one


def moved_groups(prev: Sequence[dict[int, Box]] | None, new: Sequence[dict[int, Box]]) -> list[int]:
    """Groups this rank holds in `new` with other boxes than in `prev` (per group: tensor index -> held box).
    With no previous step every held group counts as moved."""
    out = []
    for g, boxes in enumerate(new):
        if boxes and (prev is None or prev[g] != boxes):
            out.append(g)
    return out


def _held(plans, rank: int) -> list[dict[int, Box]]:
    return [dict(plan.rank_view(rank).dst_box) for _, plan in plans]


def _elements(boxes: dict[int, Box]) -> int:
    n = 0
    for box in boxes.values():
        e = 1
        for a, b in box:
            e *= b - a
        n += e
    return n


def _bytes(plan, rank: int) -> int:
    st = plan.stats.get(rank)
    return 0 if st is None else st.send + st.recv


def reconfig_stats(pull_groups: Sequence[Sequence], prev: int | None, k: int, rank: int,
                   itemsize: int) -> ReconfigStats:
    """This rank's figures for a step on candidate `k` after one on `prev` (None: the first step).
    `pull_groups[c]` is candidate c's (table indices, pull plan) per parameter group (Executor.pull_groups)."""
    if prev is None or prev == k:
        return ReconfigStats()
    new, old = pull_groups[k], pull_groups[prev]
    held_new = _held(new, rank)
    moved = moved_groups(_held(old, rank), held_new)
    recv = sum(new[g][1].stats[rank].recv for g in moved if rank in new[g][1].stats)
    elems = sum(_elements(held_new[g]) for g in moved)
    extra = sum(_bytes(p, rank) for _, p in new) - sum(_bytes(p, rank) for _, p in old)
    return ReconfigStats(True, len(moved), recv, elems * itemsize, extra)


@dataclass(frozen=True)
class FlexPipeSpec(StreamInputs):
    """Picklable factory of training's FlexPipe planner (what a background planner process builds it from)."""

    depths: tuple[int, ...] = ()
    memory: MemoryConfig = MemoryConfig()

    def __call__(self) -> FlexPipeStepPlanner:
        sampler, cm, _ = self.sampling(self.memory)
        return FlexPipeStepPlanner(FlexPipePlanner(cm, memory=self.memory), self.candidates, sampler, self.depths,
                                   self.max_len)


__all__ = ["FlexPipeSpec", "ReconfigStats", "moved_groups", "reconfig_stats"]
