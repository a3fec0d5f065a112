"""The proposal's sampled evaluation and its local search on it (decision 99; docs/planner.md, "Strategy proposal").

`sample_steps` draws the evaluation steps (seeded); `evaluate` plans every strategy on each with select.assign, charged
as StepPlanner's selection charges it (`charges.charge`); `search` climbs from the best pool strategies on that charged
estimate, ranking each round's `neighbours` by their proven bounds (`bound_rows`, <= the estimate) and evaluating the
REFINE_WIDTH best. Every strategy evaluated joins the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Strategy, place
from tidal.costmodel.base import CostModel
from tidal.costmodel.sync import SyncPricing
from tidal.planner.config import PROPOSAL
from tidal.planner.profiles import StrategyProfile, profile_strategies

Combo = tuple[int, ...]
# the refine search (decision 99, tuned on seeds 0 and 1 of paper_tables.py's Fig. 13 cells): rounds per start,
# strategies evaluated per round, and its splits and merges: into / of 2 or 4 pipelines (decision 103; 99 had 2 only)
REFINE_ROUNDS = 3
REFINE_WIDTH = 8
REFINE_WAYS = (2, 4)


def sample_steps(lengths, tokens_per_step: int, max_len: int, eval_steps: int, seed: int,
                 long_step: bool = False) -> list[np.ndarray]:
    """`eval_steps` steps sampled (seeded) from `lengths`; `long_step`: one more, the first sampled one plus a
    max_len document, so that the greedy cover's first pick can run a max_len sequence."""
    rng = np.random.default_rng(seed)
    l_all = np.minimum(np.asarray(lengths, dtype=np.int64), max_len)
    per = max(1, int(2 * tokens_per_step / max(1.0, float(l_all.mean()))) + 8)
    out: list[np.ndarray] = []
    for _ in range(eval_steps):
        draw = l_all[rng.integers(0, l_all.size, size=per)]
        out.append(draw[: int(np.searchsorted(np.cumsum(draw), tokens_per_step)) + 1])
    if long_step:
        out.append(np.append(out[0] if out else [], max_len).astype(np.int64))
    return out


class ProfileCache:
    """select.profile_strategies per strategy, computed once: the refine search bounds a round's neighbours, then
    evaluates the best of them, and the cover's rows come from the same profiles (their cached grouped pipes and
    class arrays included). Profiles are per strategy (independent of the others), so the floats are the same."""

    def __init__(self, cost_model: CostModel, sync: SyncPricing | None = None, cp_policy: str | None = None) -> None:
        self.cost_model, self.sync, self.cp_policy = cost_model, sync, cp_policy
        self._profiles: dict[Strategy, StrategyProfile] = {}
        self.computed = 0  # strategies profiled (each once)

    def __call__(self, strategies: Sequence[Strategy]) -> tuple[StrategyProfile, ...]:
        new = [s for s in dict.fromkeys(strategies) if s not in self._profiles]
        if new:
            self._profiles.update(zip(new, profile_strategies(new, self.cost_model, self.sync, self.cp_policy)))
            self.computed += len(new)
        return tuple(self._profiles[s] for s in strategies)


def evaluate(steps: Sequence[np.ndarray], strategies: Sequence[Strategy], cache: ProfileCache,
             seed: int) -> np.ndarray:
    """Estimated (charged as `cache` charges them) step time of every strategy on every step (inf when a step holds
    a document longer than the strategy's largest MaxLen)."""
    from tidal.planner.charges import charge
    from tidal.planner.select import assign

    profs = cache(strategies)
    E = np.full((len(strategies), len(steps)), np.inf)
    for s, step in enumerate(steps):
        for i, prof in enumerate(profs):
            if int(step.max()) <= prof.max_len:
                # decisions 58 and 63: the cover as before (with them it took tp1 mixes with loose bounds)
                est, plans = assign(step, prof, seed=seed, config=PROPOSAL)
                E[i, s] = est if prof.charges is None else charge(step, prof.pipes, prof.charges, plans)[0]
    return E


def bound_rows(steps: Sequence[np.ndarray], strategies: Sequence[Strategy], cache: ProfileCache) -> np.ndarray:
    """Per strategy and step, its quick step bound plus its charge floor (<= its estimate; inf when the step holds a
    document it cannot run)."""
    from tidal.planner.bounds import StrategyBound

    profs = cache(strategies)
    out = np.full((len(profs), len(steps)), np.inf)
    for i, p in enumerate(profs):
        off = 0.0 if p.charges is None else p.charges.floor
        for s, step in enumerate(steps):
            if int(step.max()) <= p.max_len:
                out[i, s] = StrategyBound(step, p.pipes, arrays=p.class_arrays).quick + off
    return out


def neighbours(combo: Combo, space: Sequence[ParallelScheme], n_devices: int,
               ways: Sequence[int] = (2,)) -> list[Combo]:
    """Strategies one move from `combo` (indices into `space`, canonical order: most devices first): one pipeline's
    scheme replaced by another of as many devices, one pipeline split into two of half its devices (one scheme), two
    pipelines of equal size merged into one of their devices; then any devices left over filled with the smallest
    scheme the strategy already uses. Sorted, without `combo` itself. `ways` > 2 (decision 103) also splits one pipeline
    into m of 1/m its devices and merges m pipelines of one scheme into one of m times the devices (m in `ways`): e.g.
    4*tp2 -> tp4cp2 in one move, where two merges in a row each had to lower the score."""
    n = [s.num_devices for s in space]
    by_n: dict[int, list[int]] = {}
    for k in range(len(space)):
        by_n.setdefault(n[k], []).append(k)

    def canon(c: list[int]) -> Combo:
        dev = sum(n[k] for k in c)
        if c and dev < n_devices:
            small = min(c, key=lambda k: (n[k], k))
            c = c + [small] * ((n_devices - dev) // n[small])
        return tuple(sorted(c, key=lambda k: (-n[k], k)))

    out: set[Combo] = set()
    kinds = sorted(set(combo))
    for k in kinds:
        rest = list(combo)
        rest.remove(k)
        for k2 in by_n[n[k]]:
            if k2 != k:
                out.add(canon(rest + [k2]))
        for m in ways:
            if n[k] % m == 0:
                for k2 in by_n.get(n[k] // m, []):
                    out.add(canon(rest + [k2] * m))
    for i, k in enumerate(kinds):
        for k2 in kinds[i:]:
            if n[k] != n[k2] or (k == k2 and combo.count(k) < 2):
                continue
            rest = list(combo)
            rest.remove(k)
            rest.remove(k2)
            for k3 in by_n.get(2 * n[k], []):
                out.add(canon(rest + [k3]))
    for m in ways:
        if m == 2:
            continue
        for k in kinds:
            if combo.count(k) >= m:
                rest = list(combo)
                for _ in range(m):
                    rest.remove(k)
                for k3 in by_n.get(m * n[k], []):
                    out.add(canon(rest + [k3]))
    out.discard(tuple(combo))
    return sorted(c for c in out if c and sum(n[k] for k in c) <= n_devices)


def search(starts: Sequence[tuple[Combo, Callable[[np.ndarray], float]]], space: Sequence[ParallelScheme],
           n_devices: int, known: dict[Combo, np.ndarray], steps: Sequence[np.ndarray], cache: ProfileCache,
           seed: int) -> dict[Combo, tuple[Strategy, np.ndarray]]:
    """Hill climbing (REFINE_ROUNDS rounds, `neighbours` with REFINE_WAYS) from each start (combo, score): the score
    of a row of estimates over the evaluation steps is nondecreasing in every entry (the mean, or the mean of its
    minimum with the other chosen strategies' rows). `known`: the rows evaluated so far (the starts' included); a
    neighbour's row is `evaluate`'s on `steps`, and a neighbour whose row of `bound_rows` (<= the estimates) scores no
    better is never evaluated. Returns every strategy it evaluated: combo -> (placed strategy, row)."""
    found: dict[Combo, tuple[Strategy, np.ndarray]] = {}
    rows = dict(known)
    for start, score in starts:
        cur = start
        if not np.isfinite(score(rows[cur])):
            continue
        pruned: set[Combo] = set()  # for this start's score
        for _ in range(REFINE_ROUNDS):
            near = neighbours(cur, space, n_devices, REFINE_WAYS)
            cur_val = score(rows[cur])
            placed: list[tuple[Combo, Strategy]] = []
            for c in near:
                if c in rows or c in pruned:
                    continue
                try:
                    placed.append((c, place(tuple(space[k] for k in c), cache.cost_model.cluster,
                                            cache.cost_model.model)))
                except TidalError:
                    pruned.add(c)
            if placed:
                lb = bound_rows(steps, [st for _, st in placed], cache)
                lv = [score(r) for r in lb]
                order = sorted(range(len(placed)), key=lambda i: (lv[i], placed[i][0]))
                keep = [i for i in order if lv[i] < cur_val][:REFINE_WIDTH]
                pruned.update(placed[i][0] for i in order if i not in keep)
                if keep:
                    for i, row in zip(keep, evaluate(steps, [placed[i][1] for i in keep], cache, seed)):
                        found[placed[i][0]] = (placed[i][1], row)
                        rows[placed[i][0]] = row
            best = min((score(rows[c]), c) for c in [cur, *near] if c in rows)
            if best[1] == cur:
                break
            cur = best[1]
    return found
