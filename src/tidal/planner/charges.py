"""What the simulator charges a packed plan beyond its balanced compute, charged in the planner's estimates too
(decision 86; docs/planner.md, "Charges"): each candidate pipeline's gradient pull/push (`costmodel.sync`, charged on
the packed plan since it overlaps the first forward and last backward; its least value, `Charges.floor`, is added
to the candidate's bounds so that estimate >= bound holds) and the CP kernel imbalance of its CP micro-batches
(`cp_adaptive.charged_pipeline_time`, decision 77; a factor >= 1, so no bound term).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tidal.core.plan import PipelinePlan
from tidal.core.strategy import Strategy
from tidal.costmodel.base import CostModel, pipeline_device
from tidal.costmodel.kernel import KernelModel
from tidal.costmodel.sync import SyncPricing, pipeline_sync, sync_delay
from tidal.planner.bounds import PipeCost
from tidal.planner.cp_adaptive import charged_pipeline_time, choose_for_micro_batches, cp_kernel


@dataclass(frozen=True, eq=False)
class Charges:
    """What `charge` adds to one candidate's packed plans: under `sync` (None: not charged), each pipeline's pull and
    push seconds per stage and the stage's layers; under the CP sharding `policy` (None: not charged), the kernel of
    each CP > 1 pipeline."""

    sync: SyncPricing | None = None
    pull: tuple[np.ndarray, ...] = ()
    push: tuple[np.ndarray, ...] = ()
    layers: tuple[np.ndarray, ...] = ()
    floor: float = 0.0  # least sync delay any non-empty pipeline can get: added to the candidate's bounds
    policy: str | None = None
    kernels: tuple[KernelModel | None, ...] = ()

    def delay(self, j: int, t_first: float, t_last: float) -> float:
        """Seconds pipeline j's sync adds when its first / last micro-batch takes t_first / t_last (forward +
        backward on a stage)."""
        fs = self.sync.fwd_share
        return sync_delay(self.pull[j], self.push[j], self.layers[j], fs * t_first, (1 - fs) * t_last,
                          self.sync.overlap)


def charges_of(strategy: Strategy, pipes: tuple[PipeCost, ...], splits, cost_model: CostModel,
               sync: SyncPricing | None, cp_policy: str | None) -> Charges | None:
    """A candidate's Charges (None when neither is charged): with `sync`, the pull/push of every pipeline, the
    optimizer state sharded over the whole cluster (as the simulator shards it)."""
    if sync is None and cp_policy is None:
        return None
    m, cl = cost_model.model, cost_model.cluster
    kernels = () if cp_policy is None else tuple(cp_kernel(m, p.scheme.tp, pipeline_device(cl, p))
                                                 if p.scheme.cp > 1 else None for p in strategy.pipelines)
    if sync is None:
        return Charges(policy=cp_policy, kernels=kernels)
    ps = [pipeline_sync(m, cl, p.devices, p.scheme.tp, p.scheme.cp, split, cl.num_devices, sync)
          for p, split in zip(strategy.pipelines, splits)]
    ch = Charges(sync, tuple(a for a, _ in ps), tuple(b for _, b in ps),
                 tuple(np.asarray(split, dtype=np.float64) for split in splits), 0.0, cp_policy, kernels)
    floor = np.inf
    for j, pc in enumerate(pipes):
        # a micro-batch's longest stage time: MaxLen tokens in one document, plus a per-document term per token
        t = pc.c + pc.a * float(pc.max_len) ** 2 + (pc.b + pc.d) * pc.max_len
        floor = min(floor, ch.delay(j, t, t))
    return replace(ch, floor=float(floor if np.isfinite(floor) else 0.0))


def charge(lengths: np.ndarray, pipes: tuple[PipeCost, ...], ch: Charges, plans: tuple[PipelinePlan, ...]
           ) -> tuple[float, tuple[PipelinePlan, ...]]:
    """The plans with each non-empty CP pipeline's estimate raised to its kernel-imbalance charge, then each
    non-empty pipeline's by its sync delay, its micro-batches reordered (longest first, next longest last) when
    that delay is smaller: (step estimate, plans)."""
    out = []
    for j, pl in enumerate(plans):
        if pl.micro_batches and ch.kernels and ch.kernels[j] is not None:
            kern = ch.kernels[j]
            modes = choose_for_micro_batches(lengths, pl.micro_batches, pl.cp, kern, ch.policy)
            t = charged_pipeline_time(lengths, pl.micro_batches, pipes[j].coeffs, pl.pp, pl.cp, modes, kern)
            pl = replace(pl, est_time=max(pl.est_time, t))
        if pl.micro_batches and ch.sync is not None:
            pc = pipes[j]
            t = [pc.c + float(np.sum(pc.work(lengths[list(mb)]))) for mb in pl.micro_batches]
            delay = ch.delay(j, t[0], t[-1])
            if len(t) > 1:
                # the longest micro-batch first (it hides the pull), the next longest last (the push): the pipeline
                # formula does not depend on the order, the overlap does
                order = sorted(range(len(t)), key=lambda m: (-t[m], m))
                mid = [m for m in range(len(t)) if m not in order[:2]]
                new = [order[0], *mid, order[1]]
                d2 = ch.delay(j, t[new[0]], t[new[-1]])
                if d2 < delay:
                    delay = d2
                    pl = replace(pl, micro_batches=tuple(pl.micro_batches[m] for m in new))
            pl = replace(pl, est_time=pl.est_time + delay)
        out.append(pl)
    return max((p.est_time for p in out), default=0.0), tuple(out)
