"""A training job, validated before any process group exists, and the planner it plans with.

:func:`prepare` resolves and validates everything `tidal train`, `tidal verify`, `tidal demo` and the dry runs of
`tidal plan` / `tidal simulate --config` need (model, cluster vs world size, corpus, cost model, candidate strategies
placed and costed, planning and execution options) and returns a picklable :class:`Prepared`;
:func:`planner_spec` / :func:`make_planner` build the job's planner from it (`runtime.planahead.PlannerSpec`, or
HBSA's `runtime.reconfig.FlexPipeSpec`). The training loop itself is `runtime.train.train_worker`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidal.baselines.flexpipe_steps import flexpipe_candidates, parse_depths
from tidal.baselines.packings import PACKINGS
from tidal.core.cluster import ClusterSpec, get_cluster, with_memory
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.core.scheme import parse_strategies
from tidal.core.strategy import Strategy, place
from tidal.costmodel.analytic import AnalyticCostModel, named_efficiency
from tidal.costmodel.base import pipeline_device
from tidal.costmodel.loader import load_cost_model
from tidal.costmodel.memory import AUTO_ORDER, MemoryConfig, auto_recompute, executor_memory
from tidal.costmodel.recompute import RecomputeCostModel
from tidal.costmodel.sync import SyncPricing
from tidal.data.accounting import EpochLedger
from tidal.data.corpus import corpus_from_spec
from tidal.models.attention import BACKENDS
from tidal.models.dense import COMPILE_MODES
from tidal.planner.select import profile_strategies
from tidal.planner.stepper import PlanningOptions, StepPlanner, build_candidates, get_packing
from tidal.runtime import ckptdir
from tidal.runtime.calibration import REFIT_MODES
from tidal.runtime.config import TrainConfig, compute_dtype_for
from tidal.runtime.executor import ExecConfig
from tidal.runtime.gcsync import StepGC
from tidal.runtime.planahead import PlannerSpec
from tidal.runtime.pp import SCHEDULES
from tidal.runtime.reconfig import FlexPipeSpec

PROPOSAL_SAMPLE = 20000


@dataclass(frozen=True)
class Prepared:
    """A validated, runnable job (picklable: it travels to spawned ranks)."""

    config: TrainConfig
    spec: ModelSpec
    cluster: ClusterSpec
    candidates: tuple[Strategy, ...]
    options: PlanningOptions
    exec_config: ExecConfig
    resume_from: str = ""  # the verified checkpoint a resumed run starts from (prepare: ckptdir.resolve)

    @property
    def world(self) -> int:
        return self.cluster.num_devices

    def cost_model(self):
        """The planner's cost model (rebuilt where needed: fitted models hold read-only mappings that do not pickle)."""
        return build_cost_model(self.config, self.spec, self.cluster)

    @property
    def charges(self) -> tuple[SyncPricing | None, str | None]:
        """What the job's planner charges beyond balanced compute (`planning_charges`)."""
        return planning_charges(self.config)


def planning_charges(cfg: TrainConfig) -> tuple[SyncPricing | None, str | None]:
    """(pull/push pricing, CP sharding policy) the job's proposal and selection charge (decisions 86, 98): with
    `[planner] charges` (the default) the gradient pull/push priced as `tidal simulate` executes it
    (`costmodel.sync.SyncPricing`'s defaults, which are the simulator's `SimConfig().sync`) and the CP kernel
    imbalance under `[planner] cp_sharding`; (None, None) with `charges = false` (the ablation) or the FlexPipe
    planner (HBSA prices its own mappings)."""
    if not cfg.planner.charges or cfg.planner.name != "tidal":
        return None, None
    return SyncPricing(), cfg.planner.cp_sharding


def train_memory(cfg: TrainConfig, cluster: ClusterSpec) -> MemoryConfig:
    """What the executor of this job holds (decision 72), for the planner's MaxLen: the compute dtype as the ranks
    will resolve it (`auto`: bf16 on a GPU cluster, fp32 on a CPU one), the master dtype as configured, and the
    configured activation recomputation per stage (decision 90)."""
    kind = "cpu" if all(g.device.name == "cpu" for g in cluster.groups) else "cuda"
    # the compiled layer's smaller activations only where `dense` is named: `auto` may fall back to eager at start-up
    # (models.dense.choose_compile), after the planner has sized its micro-batches, and eager holds more
    mem = executor_memory(compute_dtype_for(cfg.train.compute_dtype, cfg.train.master_dtype, kind),
                          cfg.train.master_dtype, compile="dense" if cfg.model.compile == "dense" else "off")
    if cfg.train.recompute == "auto":  # per scheme, the cheapest mode that holds [data] max_len (decision 90)
        return dataclasses.replace(mem, recompute="auto", recompute_need=cfg.data.max_len)
    return dataclasses.replace(mem, recompute=cfg.train.recompute)


def build_cost_model(cfg: TrainConfig, spec: ModelSpec, cluster: ClusterSpec):
    """The planner's cost model: a file (fitted, profile, pool), or the analytic model by name: `analytic` (the
    default, calibrated on Hydraulis' pools) or `analytic-eager` (priced for this runtime, fitted on one H200;
    decision 116), with the job's memory model and recomputation."""
    eff = named_efficiency(cfg.planner.cost_model)
    if eff is None:
        if cfg.train.recompute != "none":
            raise TidalError("[train] recompute needs the analytic cost model (its memory model); a cost model file "
                             "has measured MaxLens")
        # unprofiled schemes' MaxLen from the job's memory model (its dtypes), as without a file
        return load_cost_model(cfg.planner.cost_model, spec, cluster, memory=train_memory(cfg, cluster))
    mem = train_memory(cfg, cluster)
    if mem.recompute == ("none",):
        return AnalyticCostModel(spec, cluster, eff, memory=mem)
    # MaxLen under the modes, and the forward each mode repeats charged in the coefficients (costmodel/recompute.py)
    base = AnalyticCostModel(spec, cluster, eff, memory=dataclasses.replace(mem, recompute="none"))
    if mem.recompute == ("auto",):
        return RecomputeCostModel(base, "auto", need=mem.recompute_need)
    return RecomputeCostModel(base, ",".join(mem.recompute))


def prepare(cfg: TrainConfig, nproc: int | None = None) -> Prepared:
    """Everything that can be checked before ranks start; raises TidalError with one line otherwise."""
    spec = cfg.model.spec()
    cluster = get_cluster(cfg.world.cluster)
    if cfg.world.memory_gib:
        cluster = with_memory(cluster, cfg.world.memory_gib * 2**30)
    if nproc is not None and nproc != cluster.num_devices:
        raise TidalError(f"world size {nproc} does not match cluster {cluster.name} ({cluster.num_devices} devices); "
                         f"set [world] cluster to TYPEx{nproc}")
    if cfg.model.attn_backend not in BACKENDS:
        raise TidalError(f"unknown attention backend {cfg.model.attn_backend!r}; choose one of {', '.join(BACKENDS)}")
    if cfg.model.compile not in COMPILE_MODES:
        raise TidalError(f"[model] compile must be one of {', '.join(COMPILE_MODES)}, got {cfg.model.compile!r}")
    if cfg.train.schedule not in SCHEDULES:
        raise TidalError(f"unknown pipeline schedule {cfg.train.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if cfg.train.steps < 1:
        raise TidalError(f"[train] steps must be >= 1, got {cfg.train.steps}")
    for section, value in (("data", cfg.data.seed), ("train", cfg.train.seed)):
        if value < 0:
            raise TidalError(f"[{section}] seed must be >= 0, got {value}")
    if cfg.train.refit not in REFIT_MODES:
        raise TidalError(f"[train] refit must be one of {', '.join(REFIT_MODES)}, got {cfg.train.refit!r}")
    if cfg.train.refit_every < 1:
        raise TidalError(f"[train] refit_every must be >= 1, got {cfg.train.refit_every}")
    if cfg.train.checkpoint_every < 0:
        raise TidalError(f"[train] checkpoint_every must be >= 0, got {cfg.train.checkpoint_every}")
    if (cfg.train.resume or cfg.train.checkpoint_every) and not cfg.train.checkpoint_dir:
        raise TidalError("[train] resume and checkpoint_every need checkpoint_dir")
    resume_from = ""
    if cfg.train.resume:  # missing, damaged or foreign: falls back or fails before any rank starts
        res = ckptdir.resolve(cfg.train.checkpoint_dir, spec)
        if res.note and os.environ.get("RANK", "0") == "0":
            ckptdir.say(res.note)
        if res.meta["step"] >= cfg.train.steps:
            raise TidalError(f"resume: {res.path} is at step {res.meta['step']} >= [train] steps {cfg.train.steps}: "
                             f"nothing left to train (raise --steps)")
        resume_from = res.path
    if cfg.train.keep_checkpoints < 0:
        raise TidalError(f"[train] keep_checkpoints must be >= 0 (0 keeps all), got {cfg.train.keep_checkpoints}")
    StepGC(cfg.train.gc_every)  # validates gc_every
    if cfg.train.plan_ahead < 0:
        raise TidalError(f"[train] plan_ahead must be >= 0 (0 plans inline), got {cfg.train.plan_ahead}")
    for info in param_table(spec):
        if info.shape[0] < cluster.num_devices:
            raise TidalError(f"model {spec.name}: {info.name} has {info.shape[0]} rows, fewer than the "
                             f"{cluster.num_devices} ranks that shard the optimizer state")
    corpus = open_corpus(cfg, spec)
    if corpus.vocab > spec.vocab:
        raise TidalError(f"corpus {cfg.data.source} has vocabulary {corpus.vocab} > model {spec.name}'s {spec.vocab}")
    cm = build_cost_model(cfg, spec, cluster)
    options = PlanningOptions(max_len=cfg.data.max_len, tokens_per_step=cfg.data.tokens_per_step,
                              packing=cfg.planner.packing, cp_sharding=cfg.planner.cp_sharding, seed=cfg.data.seed,
                              rotate=cfg.planner.rotate, exact=cfg.planner.exact)
    get_packing(PACKINGS, options.packing)  # an unknown name fails here, before any rank starts
    sample = None
    if cfg.planner.name == "flexpipe":  # every (depth, split) HBSA may pick (baselines/flexpipe_steps.py)
        candidates = flexpipe_candidates(spec.layers, cluster.num_devices, parse_depths(cfg.planner.flexpipe_depths))
        for s in candidates:
            s.pipelines[0].scheme.validate(spec)
    else:
        if cfg.planner.strategies.strip().lower() != "auto":  # memory first: clearer than the max_len check
            profile_strategies(tuple(place(sch, cluster, spec) for sch in parse_strategies(cfg.planner.strategies)),
                               cm)
        else:
            src = corpus.length_source()
            n = PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE)
            sample = np.minimum(src.lengths(0, n), cfg.data.max_len)
        sync, policy = planning_charges(cfg)
        candidates = build_candidates(cm, cfg.planner.strategies, sample, tokens_per_step=cfg.data.tokens_per_step,
                                      max_len=cfg.data.max_len, seed=cfg.data.seed, sync=sync, cp_policy=policy,
                                      refine=cfg.planner.refine)
    for s in candidates:
        if s.num_devices > cluster.num_devices:
            raise TidalError(f"strategy {s} needs {s.num_devices} devices; the world has {cluster.num_devices}")
    profile_strategies(candidates, cm)  # a scheme that does not fit memory raises here
    schemes = ()
    if cfg.train.recompute == "auto":  # each candidate scheme's modes, as the planner's MaxLen assumed them
        mem = train_memory(cfg, cluster)
        table: dict[str, tuple[str, ...]] = {}
        for p in (p for s in candidates for p in s.pipelines):  # one scheme on two device types: the costlier
            modes = auto_recompute(spec, p.scheme, pipeline_device(cluster, p), cluster.num_devices, mem)
            old = table.get(str(p.scheme), modes)
            table[str(p.scheme)] = tuple(max(a, b, key=AUTO_ORDER.index) for a, b in zip(old, modes))
        schemes = tuple(sorted(table.items()))
    ex = ExecConfig(seed=cfg.train.seed, master_dtype=cfg.train.master_dtype, compute_dtype=cfg.train.compute_dtype,
                    schedule=cfg.train.schedule, attn_backend=cfg.model.attn_backend, compile=cfg.model.compile,
                    overlap_pull=cfg.train.overlap_pull, sequence_parallel=cfg.train.sequence_parallel,
                    recompute="none" if cfg.train.recompute == "auto" else cfg.train.recompute,
                    recompute_schemes=schemes, offload=cfg.train.offload)
    if cfg.train.metrics:
        parent = Path(cfg.train.metrics).parent
        if not parent.is_dir():
            raise TidalError(f"metrics path {cfg.train.metrics}: directory {parent} does not exist")
        if Path(cfg.train.metrics).is_dir():
            raise TidalError(f"metrics path {cfg.train.metrics} is a directory, not a file")
    return Prepared(cfg, spec, cluster, candidates, options, ex, resume_from)


def open_corpus(cfg: TrainConfig, spec: ModelSpec):
    return corpus_from_spec(cfg.data.source, seed=cfg.data.seed, vocab=spec.vocab, tokenizer=cfg.data.tokenizer or None,
                            cache_dir=cfg.data.cache_dir or None)


def planner_spec(job: Prepared) -> PlannerSpec | FlexPipeSpec:
    """The picklable, torch-free inputs of the job's planner (what a background planner process builds it from)."""
    cfg, d = job.config, job.config.data
    if cfg.planner.name == "flexpipe":
        return FlexPipeSpec(d.source, d.seed, job.spec.vocab, d.tokenizer, d.cache_dir, d.tokens_per_step, d.max_len,
                            d.long_docs, d.cycle, cfg.planner.cost_model, job.spec, job.cluster, job.candidates,
                            parse_depths(cfg.planner.flexpipe_depths), train_memory(cfg, job.cluster))
    sync, policy = job.charges
    return PlannerSpec(d.source, d.seed, job.spec.vocab, d.tokenizer, d.cache_dir, d.tokens_per_step, d.max_len,
                       d.long_docs, d.cycle, cfg.planner.cost_model, job.spec, job.cluster, job.candidates,
                       job.options, train_memory(cfg, job.cluster), sync=sync, charge_cp=policy is not None)


def make_planner(job: Prepared) -> tuple[StepPlanner, object]:
    return planner_spec(job).build()


def make_ledger(job: Prepared, corpus) -> EpochLedger | None:
    """Exactly-once accounting of a finite corpus's epoch (None for infinite or cycling sources)."""
    src = corpus.length_source()
    if src.size is None or job.config.data.cycle:
        return None
    cut = job.config.data.max_len if job.config.data.long_docs == "truncate" else None
    return EpochLedger(src.lengths(0, src.size), src.spec, truncate_at=cut)
