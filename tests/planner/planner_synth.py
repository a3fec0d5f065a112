"""Cheap synthetic strategies for planner property tests: hand-picked coefficients, no cost model."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from tidal.core import get_cluster, parse_strategy, place
from tidal.planner.bounds import PipeCost, StrategyBound
from tidal.planner.select import StrategyProfile

CLUSTER = get_cluster("cpux16")

# scheme string -> PipeCost (a, b, c, pp, max_len); lengths in tests are <= 600
COSTS = {
    "tp4": PipeCost(2e-5, 5e-3, 0.03, 1, 400),
    "tp2": PipeCost(4e-5, 1e-2, 0.02, 1, 150),
    "tp1": PipeCost(8e-5, 2e-2, 0.01, 1, 80),
    "tp2pp2": PipeCost(2e-5, 5e-3, 0.015, 2, 250),
    "pp2": PipeCost(4e-5, 1e-2, 0.005, 2, 100),
    "tp2cp2": PipeCost(1e-5, 2.6e-3, 0.04, 1, 500),
    "tp4pp4": PipeCost(5e-6, 1.3e-3, 0.008, 4, 450),
}

STRATEGIES = ("2*tp4", "tp4+2*tp2", "2*tp2pp2", "tp2cp2+4*tp1", "4*pp2", "tp4pp4", "tp2cp2+tp4+tp2pp2")


def profile(text: str) -> StrategyProfile:
    schemes = parse_strategy(text)
    strat = place(schemes, CLUSTER)
    pipes = tuple(COSTS[s.short()] for s in schemes)
    splits = tuple(s.stage_layers(8) for s in schemes)
    return StrategyProfile(strat, pipes, splits)


PROFILES = tuple(profile(s) for s in STRATEGIES)
MAX_LEN = max(p.max_len for p in PROFILES)



def step_lengths(max_size: int = 50, cap: int = 600):
    """Hypothesis strategy for a step's lengths: mixed 1..cap tokens, or many 20-80-token documents (fills the
    80-token tp1 pipelines)."""
    return st.one_of(st.lists(st.integers(1, min(600, cap)), min_size=2, max_size=max_size),
                     st.lists(st.integers(20, min(80, cap)), min_size=10, max_size=80))


def profile_steps(max_size: int = 50):
    """Hypothesis strategy for (profile, lengths as int64) with every length within that profile's MaxLen."""
    return st.integers(0, len(PROFILES) - 1).flatmap(
        lambda k: step_lengths(max_size, PROFILES[k].max_len).map(
            lambda ls: (PROFILES[k], np.asarray(ls, dtype=np.int64))))


def real_step(model: str, cluster: str, strategy: str, source: str, seed: int, step: int,
              tokens: int) -> tuple[StrategyProfile, np.ndarray]:
    """(profile, lengths) of one step of the benchmark grid on one strategy, with the analytic cost model (max_len
    32,768): the diagnosed steps the planner tests pin."""
    from tidal.core import get_model
    from tidal.costmodel.analytic import analytic_v1  # the model the scenario was diagnosed under
    from tidal.data import sample_steps
    from tidal.planner.select import profile_strategies

    m, c = get_model(model), get_cluster(cluster)
    prof = profile_strategies([place(parse_strategy(strategy), c, m)], analytic_v1(m, c))[0]
    l_ = sample_steps(source, seed=seed, tokens_per_step=tokens, max_len=32768, steps=step + 1)[0][step]
    return prof, l_.lengths_array()


def formula_cases(n: int, seed: int):
    """(q, c, M, W, tok, wm, cnt, g) with PP = 1 and c = 0 among them (the formula's special cases)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        q = int(rng.integers(0, 8)) if rng.random() < 0.8 else 0
        c = 0.0 if rng.random() < 0.15 else float(rng.lognormal(-2, 1))
        M = int(rng.integers(256, 65536))
        cnt = int(rng.integers(1, 400))
        tok = int(rng.integers(1, 40 * M))
        wm = 0.0 if rng.random() < 0.05 else float(rng.lognormal(-1, 1))
        W = wm * float(rng.uniform(1, cnt))
        g = int(rng.integers(0, 4))
        yield q, c, M, W, tok, wm, cnt, g


# pipeline kinds of the mode bound's random instances (tests of proof.modes and proof.kernels_modes)
MODE_KINDS = [PipeCost(1e-3, 1.0, 0.5, 1, 64), PipeCost(0.5e-3, 0.5, 0.5, 2, 128), PipeCost(2e-4, 0.25, 1.0, 4, 200),
              PipeCost(2e-3, 2.0, 0.1, 1, 8), PipeCost(1e-4, 0.3, 0.0, 2, 150), PipeCost(0.0, 0.0, 0.0, 1, 100),
              PipeCost(3e-4, 0.2, 0.2, 1, 256, 0.7), PipeCost(1e-5, 0.01, 0.3, 1, 5),
              PipeCost(1e-6, 1e-3, 1e-4, 8, 256)]


def open_bounds(rng, count: int, max_docs: int, kinds=MODE_KINDS):
    """`count` random steps drawn from `rng` (1-5 pipelines of `kinds`, 1 to max_docs - 1 documents up to the longest
    MaxLen); yields the StrategyBound of each one the quick bounds do not settle (`final` is None)."""
    for _ in range(count):
        pipes = [kinds[rng.integers(0, len(kinds))] for _ in range(rng.integers(1, 6))]
        l_ = rng.integers(1, max(p.max_len for p in pipes) + 1, size=rng.integers(1, max_docs))
        sb = StrategyBound(l_, pipes)
        if sb.final is None:
            yield sb


ONE_STAGE = (0, 1, 3)  # PROFILES whose pipelines are all one-stage: 2*tp4, tp4+2*tp2, tp2cp2+4*tp1


def one_stage_cases(max_size: int = 80):
    """(profile, lengths) for the passes that run on one-stage plans only (repair, exchange)."""
    return st.sampled_from(ONE_STAGE).flatmap(lambda k: step_lengths(max_size, PROFILES[k].max_len).map(
        lambda ls: (PROFILES[k], np.asarray(ls, dtype=np.int64))))


def check_plan(l_, prof, est, plans) -> None:
    """A pass's plan is checked: every document once, no empty micro-batch, each within its pipeline's MaxLen, and
    each pipeline's time (and the step's) recomputed exactly the planner's way."""
    from tidal.planner.packing import pipeline_time

    assert est == max(p.est_time for p in plans)
    assert sorted(i for p in plans for mb in p.micro_batches for i in mb) == list(range(l_.size))
    lf = l_.astype(np.float64)
    for p, pc in zip(plans, prof.pipes):
        assert all(len(mb) and int(l_[list(mb)].sum()) <= pc.max_len for mb in p.micro_batches)
        assert p.est_time == pipeline_time(lf, p.micro_batches, pc.coeffs, pc.pp)
