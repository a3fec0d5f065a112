"""FlexPipe as `tidal train`'s planner (`[planner] name = "flexpipe"`, `tidal verify --planner flexpipe`).

Each step HBSA (baselines/flexpipe.py, flexpipe.txt §5 Alg. 1 with its triggers A-D) picks the pipeline depth N, the
(possibly uneven) layer split and the stages' device groups for the step's sequences. The decision is translated
into the executor's terms (decision 91):

- a mapping of N stages becomes floor(D / N) pipelines of PP = N with the mapping's layer split: the devices a
  shallower pipeline frees run as data-parallel pipelines in the same step. Stage i of pipeline j runs on device
  i * floor(D / N) + j, so a stage's replicas sit on consecutive devices as in FlexPipe's device groups. HBSA may give
  stages unequal GPU counts (its stages are data parallel inside); whole pipelines cannot express that, so the
  translation uses the same number of replicas per stage (D mod N devices idle, none for N dividing D);
- the executor's candidates are fixed at start-up (its groups and stage models are built once), so they are every
  (N, split) HBSA's bounds admit (lines 9-11: layers per stage within [L // N, L // N + L mod N]), for each depth
  the run may use; HBSA never leaves that set, so every decision has its candidate;
- the step's sequences go to the pipelines longest first, each to the pipeline with the fewest tokens, and inside a
  pipeline to micro-batches the same way (max(N, 2) micro-batches at most, FlexPipe's micro-batches per stage).

`depths` (`[planner] flexpipe_depths = "1,2,4"`) forces the depth sequence, cycled step by step; the split and device
groups are still HBSA's search for that depth. It exists to show reconfiguration on every step (`tidal verify`):
on a small model every depth fits memory, so HBSA's own triggers keep one stage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tidal.baselines.flexpipe import FlexPipePlanner, Mapping
from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan, StepPlan
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Pipeline, Strategy
from tidal.planner.stepper import PlannedStep, StepPlanner, StepSource, read_step

MAX_SPLITS = 64  # candidates per depth (start-up builds a stage model and plans for each)


def parse_depths(text: str) -> tuple[int, ...]:
    """"" -> () (HBSA decides); "1,2,4" -> (1, 2, 4). One-line TidalError on anything else."""
    if not text.strip():
        return ()
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise TidalError(f"flexpipe_depths must be comma-separated integers like '1,2,4', got {text!r}") from None
    if min(out) < 1:
        raise TidalError(f"flexpipe_depths must be >= 1, got {text!r}")
    return out


def layer_splits(layers: int, depth: int) -> list[tuple[int, ...]]:
    """Every split of `layers` into `depth` stages within HBSA's bounds [L // N, L // N + L mod N] per stage."""
    lo = layers // depth
    hi = lo + layers % depth
    if lo < 1:
        return []
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], left: int) -> None:
        k = depth - len(prefix)
        if k == 0:
            if left == 0:
                out.append(prefix)
            return
        for n in range(lo, hi + 1):
            if (k - 1) * lo <= left - n <= (k - 1) * hi:
                rec(prefix + (n,), left - n)

    rec((), layers)
    return out


def strategy_for(depth: int, split: tuple[int, ...], devices: int) -> Strategy:
    """floor(D / N) pipelines of PP = N; stage i of pipeline j on device i * floor(D / N) + j."""
    per = devices // depth
    if per < 1:
        raise TidalError(f"FlexPipe depth {depth} needs at least {depth} devices, the world has {devices}")
    scheme = ParallelScheme(1, depth, 1, tuple(split) if depth > 1 else None)
    return Strategy(tuple(Pipeline(scheme, tuple(i * per + j for i in range(depth))) for j in range(per)))


def flexpipe_candidates(layers: int, devices: int, depths: Sequence[int] = ()) -> tuple[Strategy, ...]:
    """The executor's candidates: one per (depth, split) the run may use (`depths`, else every depth HBSA may pick:
    1 .. min(D, L))."""
    use = sorted(set(depths)) if depths else list(range(1, min(devices, layers) + 1))
    out = []
    for n in use:
        if n > layers or n > devices:
            raise TidalError(f"FlexPipe depth {n} exceeds the model's {layers} layers or the {devices} devices")
        splits = layer_splits(layers, n)
        if len(splits) > MAX_SPLITS:
            raise TidalError(f"FlexPipe depth {n} admits {len(splits)} layer splits of {layers} layers (> "
                             f"{MAX_SPLITS}); give [planner] flexpipe_depths")
        out += [strategy_for(n, s, devices) for s in splits]
    return tuple(out)


def candidate_index(candidates: Sequence[Strategy], depth: int, split: tuple[int, ...]) -> int:
    for k, s in enumerate(candidates):
        sc = s.pipelines[0].scheme
        if sc.pp == depth and (depth == 1 or tuple(sc.layer_split) == tuple(split)):
            return k
    raise TidalError(f"FlexPipe chose depth {depth} split {split}, which no candidate has")


def _lpt(weights: Sequence[int], bins: int) -> list[list[int]]:
    """Indices of `weights`, largest first, each to the bin with the least weight (ties: lowest bin)."""
    load = [0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        b = min(range(bins), key=lambda b: (load[b], b))
        out[b].append(i)
        load[b] += weights[i]
    return [sorted(x) for x in out]


@dataclass(frozen=True)
class FlexPipeChoice:
    """What HBSA decided for one step (kept in the planned step for the metrics rows)."""

    depth: int
    split: tuple[int, ...]
    action: str  # keep | memopt | grow | shrink | forced (flexpipe_depths)
    recompute: tuple[float, ...]
    switch_time: float


class FlexPipeStepPlanner:
    """`StepPlanner`'s interface (next, state_dict, load_state_dict, set_cost_model) around HBSA."""

    def __init__(self, planner: FlexPipePlanner, candidates: Sequence[Strategy], source: StepSource,
                 depths: Sequence[int] = (), max_len: int = 0) -> None:
        self.hbsa, self.candidates, self.source = planner, tuple(candidates), source
        self.depths, self.max_len = tuple(depths), max_len
        self.current: Mapping | None = None
        self.choices: list[FlexPipeChoice] = []
        self._index = 0

    def set_cost_model(self, cost_model) -> None:
        self.hbsa = replace(self.hbsa, cost_model=cost_model)

    long_doc_stats = StepPlanner.long_doc_stats

    def decide(self, lens: Sequence[int]) -> FlexPipeChoice:
        """HBSA on the step's lengths: mu the longest, n_micro micro-batches of the step's mean sum l and sum l^2."""
        arr = np.asarray(lens, dtype=np.float64)
        n_micro = max(1, min(len(arr), 8))
        mu, s1, s2 = int(arr.max()), float(arr.sum()) / n_micro, float((arr * arr).sum()) / n_micro
        if self.depths:
            n = self.depths[self._index % len(self.depths)]
            # HBSA's search for that depth, else its even split (one stage: the whole model on every device)
            mp = self.hbsa.search(n, mu, s1, s2, n_micro, self.current)[0] or self.hbsa.even(n)
            action, rc, sw = "forced", (0.0,) * n, self.hbsa.switch_time(self.current, mp)
        else:
            d = self.hbsa.decide(mu, s1, s2, n_micro, self.current)
            mp, action, rc, sw = d.mapping, d.action, d.recompute, d.switch_time
        self.current = mp
        return FlexPipeChoice(mp.stages, mp.layers, action, rc, sw)

    def next(self) -> PlannedStep | None:
        st = self.source.next_step()
        if st is None:
            return None
        t0 = time.perf_counter()
        ids, lens, docs = read_step(st)
        ch = self.decide(lens)
        k = candidate_index(self.candidates, ch.depth, ch.split)
        strategy = self.candidates[k]
        per_pipe = _lpt(lens, len(strategy.pipelines))
        cm = self.hbsa
        pipes = []
        for p, seqs in zip(strategy.pipelines, per_pipe):
            m = min(len(seqs), max(p.scheme.pp, 2))
            mbs = [tuple(seqs[i] for i in b) for b in _lpt([lens[i] for i in seqs], m)] if seqs else []
            mbs = tuple(mb for mb in mbs if mb)
            s1 = [sum(lens[i] for i in mb) for mb in mbs]
            s2 = [sum(lens[i] ** 2 for i in mb) for mb in mbs]
            mp = Mapping(tuple(p.scheme.stage_layers(cm.cost_model.model.layers)), (1,) * p.scheme.pp)
            est = cm.pipeline_time(mp, max(s1), max(s2), len(mbs), mu=max(lens[i] for i in seqs)) if mbs else 0.0
            pipes.append(PipelinePlan(1, p.scheme.pp, 1, p.devices, self.max_len or max(lens), mbs, est, (),
                                      p.scheme.layer_split))
        est_step = max((p.est_time for p in pipes), default=0.0)
        plan = StepPlan(ids, lens, k, tuple(pipes), (), est_step, 0.0, (time.perf_counter() - t0) * 1e3)
        self.choices.append(ch)
        self._index += 1
        return PlannedStep(self._index - 1, plan, None, 0.0, docs)

    def state_dict(self) -> dict:
        cur = None if self.current is None else [list(self.current.layers), list(self.current.gpus)]
        return {"planner": "flexpipe", "index": self._index, "source": self.source.state_dict(), "current": cur,
                "depths": list(self.depths), "candidates": [str(s) for s in self.candidates]}

    def load_state_dict(self, d: dict) -> None:
        if d.get("planner") != "flexpipe":
            raise TidalError("planner state is not FlexPipe's; resume with the planner that wrote it")
        self._index = int(d["index"])
        self.source.load_state_dict(d["source"])
        cur = d.get("current")
        self.current = None if cur is None else Mapping(tuple(cur[0]), tuple(cur[1]))


def reconfigurations(choices: Sequence[FlexPipeChoice]) -> int:
    """Steps whose (depth, split) differs from the step before (the first step is not one)."""
    return sum(1 for a, b in zip(choices, choices[1:]) if (a.depth, a.split) != (b.depth, b.split))


__all__ = ["FlexPipeChoice", "FlexPipeStepPlanner", "candidate_index", "flexpipe_candidates", "layer_splits",
           "parse_depths", "reconfigurations", "strategy_for"]
