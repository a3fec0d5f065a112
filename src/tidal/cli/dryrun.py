"""The workload `tidal plan` and `tidal simulate` plan: from their own flags, or, with `--config train.toml`, the
training job itself (dry run).

With `--config`, the job is what `tidal train --config` would run: the file and its `--SECTION.KEY` overrides are
loaded by the same code (`runtime.config.load_config`) and validated by the same `runtime.job.prepare` (model,
cluster, corpus, memory, candidate strategies placed and costed), and steps are planned with the job's own cost model,
candidates and planning options over the job's corpus. The flags that the file sets instead (`--model`, `--cluster`,
`--data`, ...) are refused beside it, naming the override to use, so there is one source for each setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tidal.core.errors import TidalError

# the workload flags: their default without --config, and the TOML key that sets them with it
WORKLOAD = {
    "model": ("llama2-7b", "model.name"), "cluster": ("a800x64", "world.cluster"),
    "data": ("synthetic:commoncrawl", "data.source"), "max_len": (32768, "data.max_len"),
    "long_docs": ("split", "data.long_docs"), "tokens_per_step": (200_000, "data.tokens_per_step"),
    "seed": (0, "data.seed"), "cost_model": (None, "planner.cost_model"), "strategies": ("auto", "planner.strategies"),
    "packing": ("hydraulis", "planner.packing"), "cp_sharding": ("adaptive", "planner.cp_sharding"),
    "exact": (False, "planner.exact"), "no_charges": (False, "planner.charges"),
    "no_refine": (False, "planner.refine"),
}
DEFAULT_STEPS = 10


@dataclass(frozen=True)
class Job:
    """A training job's planning inputs (`--config`): what `tidal train` would plan with."""

    cost_model: Any
    candidates: tuple
    options: Any  # planner.stepper.PlanningOptions
    sampler: Callable[[], Any]  # a fresh TokenBudgetSampler at the start of the job's data
    sample: Any  # document lengths (numpy) the proposal planned from
    steps: int  # [train] steps
    sync: Any = None  # costmodel.sync.SyncPricing the job's selection charges ([planner] charges; None: not)
    charge_cp: bool = False  # the selection charges CP kernel imbalance (StepPlanner's `charge_cp`)


def resolve(args) -> Job | None:
    """Fills the workload flags of `args` (in place) and returns the training job with `--config`, else None (the
    flags' defaults filled in). One line (TidalError) for a flag given beside --config, or an override without it."""
    from tidal.cli.configargs import overrides_of

    if "resolved_job" in vars(args):  # resolved already (run() resolves before it knows how many steps to show)
        return args.resolved_job
    args.resolved_job = _resolve(args, overrides_of(args))
    return args.resolved_job


def _resolve(args, over) -> Job | None:
    config = getattr(args, "config", None)
    if config is None:
        if over:
            raise TidalError(f"--{over[0][0]} needs --config (a training TOML); without one, use the plain flags "
                             f"(see --help)")
        for name, (default, _) in WORKLOAD.items():
            if hasattr(args, name) and getattr(args, name) in (None, False):
                setattr(args, name, default)
        if getattr(args, "plan_budget_ms", 0.0) is None:
            args.plan_budget_ms = 2000.0
        if args.steps is None:
            args.steps = DEFAULT_STEPS
        return None
    for name, (_, key) in WORKLOAD.items():
        if getattr(args, name, None) not in (None, False):
            raise TidalError(f"--{name.replace('_', '-')} with --config: the file sets it; use --{key} to change it")
    return job_of(args, config, over)


def job_of(args, config, over) -> Job:
    import numpy as np

    from tidal.cli.train import with_cache_dir
    from tidal.data.sampler import TokenBudgetSampler
    from tidal.runtime.config import load_config
    from tidal.runtime.job import PROPOSAL_SAMPLE, open_corpus, prepare

    cfg = with_cache_dir(load_config(config, over))
    job = prepare(cfg)
    d = cfg.data
    corpus = open_corpus(cfg, job.spec)
    src = corpus.length_source()
    sample = np.minimum(src.lengths(0, PROPOSAL_SAMPLE if src.size is None else min(src.size, PROPOSAL_SAMPLE)),
                        d.max_len)

    def sampler():
        return TokenBudgetSampler(open_corpus(cfg, job.spec).length_source(), d.tokens_per_step, d.max_len,
                                  long_docs=d.long_docs, seed=d.seed, cycle=d.cycle and src.size is not None)

    options = job.options
    if getattr(args, "plan_budget_ms", None) is not None:
        options = replace(options, budget_ms=args.plan_budget_ms)
    for name, value in (("model", job.spec.name), ("cluster", job.cluster.name), ("data", d.source),
                        ("max_len", d.max_len), ("long_docs", d.long_docs), ("tokens_per_step", d.tokens_per_step),
                        ("seed", d.seed), ("cost_model", cfg.planner.cost_model or None),
                        ("strategies", cfg.planner.strategies), ("packing", cfg.planner.packing),
                        ("cp_sharding", cfg.planner.cp_sharding), ("exact", cfg.planner.exact),
                        ("no_charges", not cfg.planner.charges), ("no_refine", not cfg.planner.refine)):
        setattr(args, name, value)
    if args.steps is None:
        args.steps = cfg.train.steps
    sync, policy = job.charges
    return Job(job.cost_model(), job.candidates, options, sampler, sample, cfg.train.steps, sync, policy is not None)
