"""FlexPipe's Heuristic Bound Search Algorithm (flexpipe.txt §5, Alg. 1) as a planner: per iteration, the pipeline
mapping (layers per stage, GPUs per stage; a stage's GPUs run it data parallel) and the memory optimisation.

Model (flexpipe.txt §5.1, with Tidal's cost and memory models):
- t_i, one operation of stage i (forward + backward of a micro-batch): the stage's n_i layers at the per-layer
  latency of the cost model (TP = CP = 1; the LM head on the last stage), the micro-batch split over the stage's g_i
  GPUs, plus the stage's data-parallel gradient all-reduce spread over the micro-batches; Eq. 1, read as the 1F1B
  makespan T = sum_i t_i + (n_micro - 1) max_j t_j (the printed n_micro - |S| + 1 gives (n_micro + 1) t for equal
  stages, which undercounts the fill).
- memory per GPU of stage i (Eq. 2 per stage): 16-bit parameters and gradients of its layers, fp32 optimizer state
  sharded over the job (as `costmodel.memory`), activations of the N - i micro-batches 1F1B keeps in flight at mu
  tokens each (34 B per token per hidden unit per layer; 2 B for recomputed layers), fp32 logits on the last stage.
- O_plan: per stage, the least fraction of its layers to recompute so that it fits; costs that fraction of the
  forward again (T_rc). Offloading is not modelled (T_swap = 0).
- reconfiguration T(S' -> S): every GPU copies in the layers it did not hold (16-bit parameters + fp32 optimizer
  state, 16 B per parameter, from the node's TwinLayer in host memory at `host_bw`); the slowest GPU counts.
Algorithm 1: N_stage = fewest stages whose even split fits mu (lines 3-6); bounds on layers and GPUs per stage
(lines 9-11); the recursive Search over partitions within the bounds (lines 14-26) into exactly N stages (line 19's
"remaining > upper bound" test is replaced by the feasibility of the remaining stages, r n_low <= remaining <=
r n_up, which admits every mapping within the bounds), pruned exactly by a partial bound of Eq. 1, by memory and by
dominance of (sum t, max t, migration) among prefixes ending at the same layer and GPU; triggers A-D choose keep
(1), memory optimisation (2), grow (3) or shrink (4) (lines 28-37).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field, replace

from tidal.core.errors import TidalError
from tidal.core.scheme import ParallelScheme
from tidal.costmodel.base import CostModel, LatencyCoeffs
from tidal.costmodel.memory import MemoryConfig, budget_bytes

ACTIONS = ("keep", "memopt", "grow", "shrink")

# FlexPipe Table 2 (flexpipe.txt §7.3.1): model -> ((mu, parallel strategy as DP degree per stage, M_peak GB,
# O_plan (recomputed GB, offloaded GB)), ...), as printed; BERT96 on 2 nodes of 4 A100-80GB, GPT (3.35B) on 4
TABLE2 = {
    "bert-96": ((512, (4, 4), 140, (0, 0)), (1024, (4, 4), 175, (10, 5)), (2048, (3, 3, 2), 238, (0, 0)),
                (4096, (2, 2, 2, 2), 352, (20, 12)), (8192, (1, 1, 2, 1, 1, 1, 1), 596, (18, 18))),
    "gpt-3.35b": ((512, (8, 8), 185, (15, 10)), (2048, (4, 4, 4, 4), 315, (0, 0)), (2560, (4, 4, 4, 4), 358, (25, 13)),
                  (3072, (3, 3, 3, 4, 3), 397, (0, 0)), (2560, (3, 3, 3, 4, 3), 358, (0, 0))),
}
TABLE2_BATCH = 4  # §7.2.1: a global batch size of 4 sequences
# The most of an iteration's peak memory that Table 2's O_plan saves (recomputed + offloaded GB over M_peak): 25 / 185
# (GPT (3.35B) at 512); the paper's memory optimisation covers overflows up to this share, larger ones reconfigure
TABLE2_MEMOPT_SHARE = max(sum(op) / peak for rows in TABLE2.values() for _, _, peak, op in rows)
# FlexPipe Fig. 2(c) (flexpipe.txt §2.2): GPT (3.35B) on samples of 3K tokens, 4.7 s per iteration on 3 GPUs (its
# fastest), 7.08 s on 8: (sample length, GPUs, s/iteration, GPUs, s/iteration)
FIG2C = (3072, 3, 4.7, 8, 7.08)


def _even_split(total: int, parts: int) -> tuple[int, ...]:
    """`total` split into `parts` sizes differing by at most one, the larger first."""
    q, r = divmod(total, parts)
    return tuple(q + (i < r) for i in range(parts))


def _ranges(sizes: tuple[int, ...]) -> list[range]:
    """Consecutive ranges of the given sizes, from 0."""
    ends = list(itertools.accumulate(sizes))
    return [range(e - n, e) for n, e in zip(sizes, ends)]


@dataclass(frozen=True)
class WorkloadMemory:
    """FlexPipe's own peak-memory model of its workloads (flexpipe.txt §5.1 Eq. 2: M_peak(L, B, mu) = M_pgo + M_act
    + M_buf), linear in the longest sequence mu: M_peak = states_bytes_per_param * P + act_bytes_per_token_layer *
    hidden * layers * batch * mu, P the model's parameters. Every GPU of a stage of n of the L layers holds n / L of
    the states and its n layers' activations of the `batch` sequences of mu tokens (`FlexPipePlanner.tokens`;
    recomputed layers keep 2 B per token per hidden unit). `fit_table2` fits the two constants to Table 2's M_peak of
    a model; the device's whole memory is the budget (FlexPipe's M, with M_buf inside M_peak)."""

    states_bytes_per_param: float
    act_bytes_per_token_layer: float
    batch: int = TABLE2_BATCH

    def peak(self, model, mu: float) -> float:
        return (self.states_bytes_per_param * model.num_params()
                + self.act_bytes_per_token_layer * model.hidden * model.layers * self.batch * mu)


def fit_table2(model) -> WorkloadMemory:
    """Least-squares fit of `WorkloadMemory` to FlexPipe Table 2's (mu, M_peak) rows of `model` (by name)."""
    import numpy as np

    if model.name not in TABLE2:
        raise TidalError(f"FlexPipe Table 2 has no rows for {model.name}; it has {', '.join(TABLE2)}")
    rows = TABLE2[model.name]
    mu = np.array([r[0] for r in rows], dtype=np.float64)
    peak = np.array([r[2] for r in rows], dtype=np.float64) * 1e9
    A = np.stack([np.full_like(mu, float(model.num_params())), model.hidden * model.layers * TABLE2_BATCH * mu], 1)
    (s, a), *_ = np.linalg.lstsq(A, peak, rcond=None)
    return WorkloadMemory(float(s), float(a))


def fig2c_times(planner: FlexPipePlanner, gpus, length: int = FIG2C[0], batch: int = TABLE2_BATCH) -> list[float]:
    """Eq. 1 time of `batch` samples of `length` tokens (one per micro-batch) on pipelines of g stages of one GPU each
    (Fig. 2(c)'s set-up as read here), for each g in `gpus`."""
    L = planner.cost_model.model.layers
    return [planner.pipeline_time(Mapping(_even_split(L, g), (1,) * g), float(length), float(length) ** 2, batch,
                                  mu=length) for g in gpus]


def fit_fig2c(planner: FlexPipePlanner, batch: int = TABLE2_BATCH) -> float:
    """The per-stage overhead (s per micro-batch operation) that gives Fig. 2(c)'s ratio T(8 GPUs) / T(3 GPUs) =
    7.08 / 4.7 at 3K tokens: Eq. 1 grows by (stages + n_micro - 1) x overhead, so it is solved in closed form. Only
    the ratio is used: the paper's absolute times are its own system's."""
    length, g1, t1, g2, t2 = FIG2C
    if g2 > planner.cost_model.model.layers:
        raise TidalError(f"Fig. 2(c) fit needs at least {g2} layers, {planner.cost_model.model.name} has fewer")
    base = replace(planner, stage_overhead_s=0.0)
    a, b = fig2c_times(base, (g1, g2), length, batch)
    r = t2 / t1
    den = (g2 + batch - 1) - r * (g1 + batch - 1)
    delta = (r * a - b) / den
    if den <= 0 or delta < 0:
        raise TidalError(f"Fig. 2(c)'s ratio {r:.3f} cannot be met by a per-stage overhead on this cost model")
    return float(delta)


@dataclass(frozen=True)
class Mapping:
    layers: tuple[int, ...]  # per stage, in order
    gpus: tuple[int, ...]  # per stage: GPUs (data-parallel replicas of the stage), consecutive device ids

    def __post_init__(self) -> None:
        if len(self.layers) != len(self.gpus) or not self.layers or min(self.layers) < 1 or min(self.gpus) < 1:
            raise TidalError(f"bad FlexPipe mapping {self.layers} x {self.gpus}")

    @property
    def stages(self) -> int:
        return len(self.layers)

    def device_groups(self) -> list[range]:
        return _ranges(self.gpus)

    def layer_ranges(self) -> list[range]:
        return _ranges(self.layers)

    def held_layers(self) -> dict[int, set[int]]:
        """Device -> the layers it holds."""
        return {d: set(lr) for lr, gr in zip(self.layer_ranges(), self.device_groups()) for d in gr}


@dataclass(frozen=True)
class Decision:
    mapping: Mapping
    action: str  # keep | memopt | grow | shrink
    recompute: tuple[float, ...]  # fraction of each stage's layers recomputed (O_plan)
    est_time: float  # Eq. 1 (+ T_rc) of the chosen mapping, s
    switch_time: float  # reconfiguration from the previous mapping, s
    search_ms: float
    candidates: int  # complete mappings evaluated by Search


@dataclass(frozen=True)
class FlexPipePlanner:
    cost_model: CostModel
    n_devices: int | None = None  # GPUs for the pipeline (default: the whole cluster)
    host_bw: float = 32e9  # bytes/s from the TwinLayer in host memory (PCIe 4.0 x16 achievable)
    fwd_share: float = 1.0 / 3.0
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    workload_memory: WorkloadMemory | None = None  # FlexPipe's own memory model of its workload (else Tidal's)
    # seconds each stage adds to every micro-batch operation t_i (FlexPipe's overhead of fine-grained partitioning,
    # `fit_fig2c`); 0: the cost model's stage time alone
    stage_overhead_s: float = 0.0
    # the largest share of a stage's bytes that O_plan may save (`TABLE2_MEMOPT_SHARE`); 1: recompute every layer
    memopt_share: float = 1.0

    @property
    def D(self) -> int:
        return self.n_devices or self.cost_model.cluster.num_devices

    # -- costs ------------------------------------------------------------------------------------------------

    def _dev(self):
        return min((g.device for g in self.cost_model.cluster.groups), key=lambda t: (t.peak_flops, t.name))

    def _per_layer(self) -> tuple[LatencyCoeffs, LatencyCoeffs]:
        """(per-layer, LM head) coefficients at TP = CP = 1 (slope of the cost model in the layer count)."""
        L = self.cost_model.model.layers
        k1 = self.cost_model.coeffs(ParallelScheme(1, 1, 1, (L,)), self._dev())
        k2 = self.cost_model.coeffs(ParallelScheme(1, 1, 1, (L + 1,)), self._dev())
        per = [max(0.0, y - x) for x, y in zip((k1.a, k1.b, k1.c, k1.d), (k2.a, k2.b, k2.c, k2.d))]
        head = [max(0.0, x - L * p) for x, p in zip((k1.a, k1.b, k1.c, k1.d), per)]
        return LatencyCoeffs(*per), LatencyCoeffs(*head)

    def stage_op_time(self, n_layers: int, gpus: int, last: bool, s1: float, s2: float, n_micro: int,
                      recompute: float = 0.0, mu: float = 0.0) -> float:
        """t_i of Eq. 1 for a micro-batch with sum l = s1, sum l^2 = s2 split over the stage's GPUs (a document of mu
        tokens, the longest, is not split). FlexPipe's search works on (sum l, sum l^2) only, so a per-document
        term d of the cost model is not charged here (the analytic model has none; docs/costmodel.md)."""
        per, head = self._per_layer()
        k = LatencyCoeffs(per.a * n_layers + (head.a if last else 0), per.b * n_layers + (head.b if last else 0),
                          per.c * n_layers + (head.c if last else 0))
        comp = k.c + max((k.a * s2 + k.b * s1) / gpus, k.a * mu * mu + k.b * mu)
        comp *= 1.0 + recompute * self.fwd_share
        m = self.cost_model.model
        params = n_layers * m.layer_params()
        dev = self._dev()
        bw = (dev.intra_bw if gpus <= dev.per_node else dev.inter_bw) * 0.8
        allreduce = 2 * (gpus - 1) / gpus * 2.0 * params / bw if gpus > 1 else 0.0
        return comp + allreduce / max(1, n_micro) + self.stage_overhead_s

    def pipeline_time(self, mp: Mapping, s1: float, s2: float, n_micro: int,
                      recompute: tuple[float, ...] | None = None, mu: float = 0.0) -> float:
        """Eq. 1."""
        r = recompute or (0.0,) * mp.stages
        t = [self.stage_op_time(n, g, i == mp.stages - 1, s1, s2, n_micro, r[i], mu)
             for i, (n, g) in enumerate(zip(mp.layers, mp.gpus))]
        return sum(t) + (n_micro - 1) * max(t)

    def stage_bytes(self, n_layers: int, stage: int, stages: int, tokens: float, recompute: float = 0.0) -> float:
        """Bytes per GPU of a stage: 16 B per parameter of its layers (16-bit parameters and gradients, fp32 master
        and Adam moments: data parallel without sharding), activations of min(stages - stage, in flight) micro-batches
        of `tokens` tokens under 1F1B, fp32 logits on the last stage."""
        m, cfg = self.cost_model.model, self.memory
        wm = self.workload_memory
        if wm is not None:  # `tokens` are the stage's in-flight tokens per GPU (`tokens`)
            per_layer = wm.act_bytes_per_token_layer * (1 - recompute) + 2.0 * recompute
            return (n_layers / m.layers * wm.states_bytes_per_param * m.num_params()
                    + per_layer * m.hidden * n_layers * tokens)
        params = n_layers * m.layer_params() + (m.vocab * m.hidden if stage == 0 else 0)
        if stage == stages - 1:
            params += m.hidden + (0 if m.tie_embeddings else m.vocab * m.hidden)
        states = (cfg.master_bytes_per_param + 2 * cfg.param_bytes_per_param) * params  # 16-bit params and grads
        per_layer = cfg.act_bytes_per_token_layer * (1 - recompute) + 2.0 * recompute
        act = per_layer * m.hidden * n_layers * (stages - stage) * tokens
        if stage == stages - 1:
            act += 8.0 * m.vocab * tokens
        return states + act

    def budget(self) -> float:
        if self.workload_memory is not None:
            return float(self._dev().memory_bytes)
        return budget_bytes(self._dev(), self.memory)

    def tokens(self, mu: float, s1: float, gpus: int) -> float:
        """Tokens per GPU of a micro-batch of s1 tokens split over `gpus` replicas (the longest document, mu, whole);
        under `workload_memory`, FlexPipe's accounting: every GPU of a stage holds its layers' share of M_peak, the
        activations of `batch` sequences of mu tokens (Table 2's stage counts are ceil(M_peak / M) less what O_plan
        saves, whatever the DP degree inside the stages)."""
        if self.workload_memory is not None:
            return float(self.workload_memory.batch * mu)
        return max(float(mu), s1 / gpus)

    def fits(self, mp: Mapping, mu: int, s1: float = 0.0) -> bool:
        return all(self.stage_bytes(n, i, mp.stages, self.tokens(mu, s1, g)) <= self.budget()
                   for i, (n, g) in enumerate(zip(mp.layers, mp.gpus)))

    def o_plan(self, mp: Mapping, mu: int, s1: float = 0.0, capped: bool = True) -> tuple[float, ...] | None:
        """Least recompute fraction per stage so that every stage fits (None: recomputation is not enough, or, when
        `capped`, it would have to save more than `memopt_share` of a stage's bytes: HBSA then reconfigures; the
        uncapped plan is the last resort when no mapping holds the step within the cap)."""
        share = self.memopt_share if capped else 1.0
        out = []
        for i, (n, g) in enumerate(zip(mp.layers, mp.gpus)):
            tk = self.tokens(mu, s1, g)
            full, none = self.stage_bytes(n, i, mp.stages, tk), self.stage_bytes(n, i, mp.stages, tk, 1.0)
            if full <= self.budget():
                out.append(0.0)
            elif none > self.budget() or full - self.budget() > share * full:
                return None
            else:
                out.append(min(1.0, math.ceil((full - self.budget()) / (full - none) * n) / n))
        return tuple(out)

    def switch_time(self, old: Mapping | None, new: Mapping) -> float:
        """Slowest GPU's copy-in of the layers it did not hold (16 B per parameter from host memory)."""
        if old is None or old == new:
            return 0.0
        held = old.held_layers()
        per = self.cost_model.model.layer_params() * 16.0
        worst = 0
        for lr, gr in zip(new.layer_ranges(), new.device_groups()):
            for d in gr:
                worst = max(worst, len(set(lr) - held.get(d, set())))
        return worst * per / self.host_bw

    # -- Algorithm 1 --------------------------------------------------------------------------------------------

    def even(self, stages: int) -> Mapping:
        return Mapping(_even_split(self.cost_model.model.layers, stages), _even_split(self.D, stages))

    def n_stage(self, mu: int, s1: float = 0.0) -> int:
        """Lines 3-6: the fewest stages (one GPU at least each) whose even split holds the micro-batches."""
        top = min(self.D, self.cost_model.model.layers)
        for i in range(1, top + 1):
            if self.fits(self.even(i), mu, s1):
                return i
        for capped in (True, False):  # nothing fits as is: the fewest stages that fit with recomputation
            for i in range(1, top + 1):
                if self.o_plan(self.even(i), mu, s1, capped) is not None:
                    return i
        raise TidalError(f"FlexPipe: no pipeline of at most {self.D} stages holds a {mu}-token micro-batch")

    def bounds(self, N: int, mu: int, s1: float) -> tuple[int, int, int, int]:
        """Lines 9-11: (n_low^l, n_up^l, n_low^g, n_up^g). n_max^l: the most layers one GPU holds at the stage
        position that holds the most (1F1B keeps fewer micro-batches in flight on later stages)."""
        L, D = self.cost_model.model.layers, self.D
        lo_l, lo_g = L // N, D // N
        tk = self.tokens(mu, s1, max(1, lo_g))
        n_max = max((n for k in range(N) for n in range(1, L + 1)
                     if self.stage_bytes(n, k, N, tk) <= self.budget()), default=0)
        return lo_l, min(L // N + L % N, max(n_max, lo_l)), lo_g, D // N + D % N

    def search(self, N: int, mu: int, s1: float, s2: float, n_micro: int, old: Mapping | None
               ) -> tuple[Mapping | None, float, int]:
        """Lines 9-26: best mapping of N stages within the bounds (value = Eq. 1 + reconfiguration)."""
        L, D = self.cost_model.model.layers, self.D
        lo_l, up_l, lo_g, up_g = self.bounds(N, mu, s1)
        bud = self.budget()
        if lo_l < 1 or lo_g < 1:
            return None, math.inf, 0
        if N == 1:
            mp = Mapping((L,), (D,))
            return (mp, self.pipeline_time(mp, s1, s2, n_micro, mu=mu) + self.switch_time(old, mp), 1) \
                if self.fits(mp, mu, s1) else (None, math.inf, 0)
        best: list = [None, math.inf]
        count = [0]
        seen: dict[tuple[int, int, int], list[tuple[float, float, int]]] = {}
        held = {} if old is None else old.held_layers()
        per_layer_s = self.cost_model.model.layer_params() * 16.0 / self.host_bw

        @functools.cache
        def t(n: int, g: int, last: bool) -> float:
            return self.stage_op_time(n, g, last, s1, s2, n_micro, 0.0, mu)

        def moved(l0: int, n: int, g0: int, g: int) -> int:
            """Most layers one GPU of a stage (layers l0.., GPUs g0..) must copy in from the old mapping."""
            if old is None:
                return 0
            need = set(range(l0, l0 + n))
            return max(len(need - held.get(d, set())) for d in range(g0, g0 + g))

        def rec(k: int, left_l: int, left_g: int, tsum: float, tmax: float, sw: int, path: list) -> None:
            if tsum + (n_micro - 1) * tmax + sw * per_layer_s >= best[1]:
                return  # Eq. 1 and the reconfiguration only grow as stages are added
            key = (k, left_l, left_g)
            for a, b, c in seen.get(key, ()):  # a visited prefix ending here that is no worse in every term
                if a <= tsum and b <= tmax and c <= sw:
                    return
            seen.setdefault(key, []).append((tsum, tmax, sw))
            l0, g0 = L - left_l, D - left_g
            for i in range(lo_l, up_l + 1):
                for j in range(lo_g, up_g + 1):
                    if self.stage_bytes(i, k, N, self.tokens(mu, s1, j)) > bud:
                        continue
                    rl, rg = left_l - i, left_g - j
                    ti = t(i, j, False)
                    sw_i = max(sw, moved(l0, i, g0, j))
                    r = N - k - 1  # stages after this one
                    if r >= 2 and r * lo_l <= rl <= r * up_l and r * lo_g <= rg <= r * up_g:
                        rec(k + 1, rl, rg, tsum + ti, max(tmax, ti), sw_i, path + [(i, j)])
                    elif k + 2 == N and lo_l <= rl <= up_l and lo_g <= rg <= up_g:
                        if self.stage_bytes(rl, N - 1, N, self.tokens(mu, s1, rg)) > bud:
                            continue
                        tl = t(rl, rg, True)
                        sw_l = max(sw_i, moved(l0 + i, rl, g0 + j, rg))
                        v = tsum + ti + tl + (n_micro - 1) * max(tmax, ti, tl) + sw_l * per_layer_s
                        count[0] += 1
                        if v < best[1]:
                            pth = path + [(i, j), (rl, rg)]
                            best[0], best[1] = Mapping(tuple(x for x, _ in pth), tuple(y for _, y in pth)), v

        rec(0, L, D, 0.0, 0.0, 0, [])
        return best[0], best[1], count[0]

    def decide(self, mu: int, s1: float, s2: float, n_micro: int, current: Mapping | None) -> Decision:
        """One HBSA decision for the next iteration: longest document mu tokens, n_micro micro-batches of mean
        sum l = s1 and sum l^2 = s2. A mapping that does not fit as is gets its recomputation plan."""
        d = self._decide(mu, s1, s2, n_micro, current)
        if any(d.recompute) or self.fits(d.mapping, mu, s1):
            return d
        plan = self.o_plan(d.mapping, mu, s1) or self.o_plan(d.mapping, mu, s1, capped=False)
        if plan is None:
            raise TidalError(f"FlexPipe: mapping {d.mapping.layers} x {d.mapping.gpus} cannot hold {mu} tokens")
        return Decision(d.mapping, d.action, plan, self.pipeline_time(d.mapping, s1, s2, n_micro, plan, mu),
                        d.switch_time, d.search_ms, d.candidates)

    def _decide(self, mu: int, s1: float, s2: float, n_micro: int, current: Mapping | None) -> Decision:
        t0 = time.perf_counter()
        N = self.n_stage(mu, s1)
        new, v, count = (None, math.inf, 0)
        cur_ok = current is not None and self.fits(current, mu, s1)
        if current is None or current.stages != N or not cur_ok:
            new, v, count = self.search(N, mu, s1, s2, n_micro, current)
            if new is None:  # the bounds admit no partition: fall back to the even split of N stages
                new = self.even(N)
                rc = None if self.fits(new, mu, s1) else (self.o_plan(new, mu, s1)
                                                          or self.o_plan(new, mu, s1, capped=False))
                v = self.pipeline_time(new, s1, s2, n_micro, rc, mu) + self.switch_time(current, new)
        ms = (time.perf_counter() - t0) * 1e3
        if current is None:
            return Decision(new, "grow", (0.0,) * new.stages, v, 0.0, ms, count)
        zero = (0.0,) * current.stages
        if new == current:
            new, v = None, math.inf  # nothing better to move to
        t_cur = self.pipeline_time(current, s1, s2, n_micro, mu=mu)
        if cur_ok:  # condition A
            if new is None or v >= t_cur:  # condition B: keep (1)
                return Decision(current, "keep", zero, t_cur, 0.0, ms, count)
            sw = self.switch_time(current, new)  # shrink (4), or a better mapping of as many stages
            return Decision(new, "shrink" if new.stages < current.stages else "grow", (0.0,) * new.stages, v - sw,
                            sw, ms, count)
        plan = self.o_plan(current, mu, s1)  # not A: memory optimisation under the current mapping?
        if plan is not None:  # condition C
            t_rc = self.pipeline_time(current, s1, s2, n_micro, plan, mu)
            if v >= t_rc:  # condition D: recompute instead of reconfiguring (2)
                return Decision(current, "memopt", plan, t_rc, 0.0, ms, count)
        if new is None:
            raise TidalError(f"FlexPipe: no mapping holds a {mu}-token micro-batch on {self.D} GPUs")
        sw = self.switch_time(current, new)  # grow (3)
        return Decision(new, "grow" if new.stages > current.stages else "shrink", (0.0,) * new.stages, v - sw, sw,
                        ms, count)
