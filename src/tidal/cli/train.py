"""`tidal train --config FILE.toml [--nproc N]` and `tidal verify`: training on N ranks, and its check against one
process.

Launch either under torchrun (`torchrun --nproc-per-node N -m tidal train --config x.toml`: the rank and world come
from torchrun's environment) or with `--nproc N`, which spawns N local gloo workers itself. Everything is validated
before any process group exists; a config that cannot run exits 2 with one line.
"""

from __future__ import annotations

import math
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np

from tidal.cli import args as argtypes
from tidal.core.errors import TidalError

VERIFY_TOL = {
    # float64: the distributed and the single-process runs differ only in the order of sums (TP partial sums, CP and
    # pipeline gradient reductions, the global norm), ~1e-16 per level. AdamW normalises every element, which amplifies
    # that on near-zero gradient entries: observed <= 2.1e-13 on parameters and 4.4e-14 on moments after 5 steps of
    # the stdlib corpus (benchmarks/train_verify.py), <= 2e-11 on random tokens.
    "float64": {"loss": 1e-12, "params": 1e-10, "moments": 1e-10},
    # float32: the same reorderings at eps 6e-8. Observed worst over 11 strategy specs: loss 1.2e-7, moments 1.2e-5,
    # parameters 6.6e-5 (AdamW moves every element by ~lr whatever its gradient's size, so an entry whose gradient is
    # rounding noise can step differently: up to 2 lr per step / max|p| in the worst case). Tolerances leave >= 15x.
    # AdamW is invariant to a gradient's scale, so the moments are what catch a doubled or missing reduction (a 2x
    # gradient changes m by 100%); a wrong shard or mask moves the loss and parameters by >= 1e-2.
    "float32": {"loss": 2e-6, "params": 1e-3, "moments": 2e-4},
    # bfloat16 compute with float32 master weights and moments, against a float32 reference: parameters travel and
    # activations are computed at bf16 (eps 7.8e-3; logits and losses are upcast). Measured after 5 steps on 4 ranks:
    # loss 2.8e-4, moments 3.6e-2, parameters 6.1e-2. AdamW moves each element by up to lr per step whatever its
    # gradient's size, so parameter differences are bounded by 2 * lr * steps / max|p| (~0.13 here), not by bf16's
    # eps; the loss and the moments (a doubled gradient doubles m) are the sharp checks at this precision.
    "bfloat16": {"loss": 2e-3, "params": 0.25, "moments": 0.2},
}


def add_parsers(sub) -> None:
    from tidal.cli.configargs import add_alias, add_override_args

    p = sub.add_parser("train", help="train with per-step heterogeneous strategies (TOML config)", description=__doc__,
                       usage="tidal train --config FILE [--nproc N] [--SECTION.KEY VALUE ...] [options]")
    p.add_argument("--config", type=Path, required=True, help="TOML file (docs/training.md)")
    p.add_argument("--nproc", type=argtypes.positive, default=None,
                   help="spawn this many local gloo ranks; omit under torchrun")
    add_alias(p, "--steps", "training steps", metavar="INT")
    add_alias(p, "--metrics", "JSONL metrics path", metavar="PATH")
    add_alias(p, "--refit", "'online' refits the cost model from measured steps", choices=("off", "online"))
    add_alias(p, "--cost-model", "fitted model JSON from `tidal profile`, profile CSV, or analytic-eager",
              metavar="PATH")
    add_alias(p, "--checkpoint-dir", "checkpoint directory", metavar="DIR")
    add_alias(p, "--checkpoint-every", "save every N steps", metavar="INT")
    add_alias(p, "--resume", "continue from <checkpoint_dir>/latest (weights, moments, planner and data state)",
              nargs=0)
    add_alias(p, "--collective-timeout", "the longest a rank may wait for another at a collective before the one "
                                         "that did not arrive is named (exit 5)", metavar="SECONDS")
    p.add_argument("--elastic", action="store_true",
                   help="when a rank dies, restart on the survivors from the newest verified checkpoint, re-planned "
                        "for all of them (under torchrun: resume on the world torchrun gives; use its --max-restarts)")
    p.add_argument("--max-restarts", type=int, default=3, help="with --elastic: restarts before giving up")
    p.add_argument("--timeout", type=argtypes.positive_seconds, default=None,
                   help="optional deadline for the whole run in seconds (off by default; exit 5)")
    add_override_args(p)
    p.set_defaults(func=run_train)

    v = sub.add_parser("verify", help="train distributed and in one process on the same documents; compare",
                       description="Exit 1 when parameters, Adam moments or losses differ beyond the tolerance.\n"
                                   "The flags below build the run's config; --SECTION.KEY overrides apply to it.",
                       usage="tidal verify --strategies S [--nproc N] [--SECTION.KEY VALUE ...] [options]")
    v.add_argument("--model", default="tiny",
                   help="preset name, or a TOML file whose [model] section gives a shape (docs/models.md)")
    v.add_argument("--nproc", type=argtypes.positive, default=4, help="gloo ranks to spawn ([world] cluster cpuxN)")
    v.add_argument("--strategies", default=None,
                   help="strategies separated by ';' (switched every step), or 'auto' (the planner's choice); "
                        "required with --planner tidal")
    v.add_argument("--planner", choices=("tidal", "flexpipe"), default="tidal",
                   help="flexpipe: HBSA picks depth, layer split and device groups each step (decision 91)")
    v.add_argument("--flexpipe-depths", default=None,
                   help="with --planner flexpipe: pipeline depths cycled step by step (default: the powers of two "
                        "up to min(nproc, layers), e.g. 1,2,4, so every step reconfigures); 'hbsa': HBSA's triggers")
    v.add_argument("--steps", type=argtypes.positive, default=5, help="training steps")
    v.add_argument("--dtype", choices=tuple(VERIFY_TOL), default="float64",
                   help="float64 / float32: master and compute in that dtype; bfloat16: bf16 compute, fp32 master")
    v.add_argument("--data", default="stdlib:defs", help="corpus: stdlib, stdlib:defs, random:synthetic:NAME, ...")
    v.add_argument("--max-len", type=argtypes.max_len, default=256, help="context length")
    v.add_argument("--tokens-per-step", type=argtypes.tokens_per_step, default=1024, help="tokens per step")
    v.add_argument("--seed", type=argtypes.seed, default=0, help="data and initialisation seed")
    v.add_argument("--recompute", default="none",
                   help="activation recomputation: none, full, selective, or one per stage such as 'full,selective' "
                        "(docs/runtime.md)")
    add_override_args(v, defaults=False)
    v.set_defaults(func=run_verify)


def _under_torchrun() -> tuple[int, int] | None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or taskset's limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cores_warning(ranks: int, cores: int) -> str | None:
    """One line when `ranks` CPU (gloo) ranks on this machine outnumber its `cores`, else None."""
    if ranks <= cores:
        return None
    return (f"tidal: warning: {ranks} ranks on {cores} core{'s' if cores != 1 else ''}: ranks share cores, so steps "
            f"are slower and their times noisier than one rank per core (the planner's estimates assume one)")


def warn_cores(ranks: int) -> None:
    line = cores_warning(ranks, usable_cores())
    if line:
        print(line, file=sys.stderr, flush=True)


def launch(job, entry, *args, nproc: int | None, timeout_s: float | None, collective_timeout_s: float | None = None,
           grace_s: float | None = None, watch: bool = False) -> list:
    """Run `entry(rank, world, job, *args)` on every rank: this process under torchrun, else `nproc` spawned ranks.
    Returns the results of the ranks this process ran. `timeout_s`: an optional whole-run deadline;
    `collective_timeout_s`: the per-collective timeout; `grace_s`: handle SIGTERM/SIGINT (runtime/lifecycle.py);
    `watch`: pass a `progress` table as the entry's last argument and name a rank that does not arrive at a
    collective (runtime/guard.py)."""
    import torch.distributed as dist

    from tidal.runtime.launch import run_distributed
    from tidal.runtime.lifecycle import die_with_parent

    env = _under_torchrun()
    if env is not None:
        rank, world = env
        if world != job.world:
            raise TidalError(f"torchrun world size {world} does not match cluster {job.cluster.name} "
                             f"({job.world} devices)")
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "gloo" and os.environ.get("LOCAL_RANK", "0") == "0":
            warn_cores(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        die_with_parent()  # never outlive the torchrun agent (kill -9 included)
        dist.init_process_group(backend, timeout=timedelta(seconds=collective_timeout_s or timeout_s or 1800.0))
        try:
            return [entry(rank, world, job, *args, *((None,) if watch else ()))]
        except Exception as e:  # noqa: BLE001 - one line for the user, the traceback in the detail
            import traceback

            from tidal.core.errors import RunFailure

            raise RunFailure(f"rank {rank} raised {type(e).__name__}: {' '.join(str(e).split())}",
                             traceback.format_exc()) from None
        finally:
            dist.destroy_process_group()
    import multiprocessing

    import torch

    from tidal.runtime.guard import HangMonitor, Progress

    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= job.world else "gloo"
    if backend == "gloo":
        warn_cores(job.world)
    # ranks killed on purpose (a hang, a signal) leave semaphores registered with multiprocessing's resource
    # tracker, which then warns over several lines; the user has the one line that says why (sys.warnoptions is
    # what the tracker process is started with)
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet not in sys.warnoptions:
        sys.warnoptions.append(quiet)
    monitor = None
    if watch:
        progress = Progress(job.world, multiprocessing.get_context("spawn"))
        args = (*args, progress)
        monitor = HangMonitor(progress, collective_timeout_s)
    # spawned ranks: the launcher's monitor names a missing rank after collective_timeout_s; the process group's own
    # timeout is a backstop at twice that (and never shorter than start-up on a loaded machine)
    pg = max(2 * collective_timeout_s, 300.0) if collective_timeout_s else None
    return run_distributed(entry, job.world, job, *args, backend=backend, timeout_s=timeout_s,
                           collective_timeout_s=pg, monitor=monitor, grace_s=grace_s)


def train_entry(rank: int, world: int, job, show: bool, record: bool, progress=None):
    """A rank's body: the training loop. With `show`, rank 0 reports (cli/steplog.py): one line per step (above a
    rich progress bar on a terminal, plain and flushed otherwise); start-up, resume and checkpoint lines on stderr;
    the `[train]` metric writers (cli/writers.py) whatever `show`. Rank 0 also warns once when the cost model is off
    (`cost_watch`)."""
    from tidal.cli import steplog
    from tidal.cli.writers import open_writers
    from tidal.runtime.train import train_worker

    if rank != 0:
        return train_worker(rank, world, job, record=record, progress=progress)
    watch = cost_watch(job)
    steps, nominal, log = job.config.train.steps, steplog.nominal_peak(job.cluster), steplog.announcer()
    writers = open_writers(job.config.train, job.config.to_dict())
    try:
        if not show:  # quiet: the writers alone
            return train_worker(rank, world, job,
                                on_step=both(steplog.writer_callback(writers) if writers else None, watch),
                                record=record, progress=progress)
        if steplog.plain_output():
            return train_worker(rank, world, job,
                                on_step=both(steplog.printer(steps, nominal=nominal, writers=writers), watch),
                                record=record, progress=progress, log=log)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
        with bar:
            task = bar.add_task("train", total=steps)

            def on_step(row: dict) -> None:  # the step's line above the bar (wrapped to the terminal, never cut)
                bar.console.print(steplog.step_line(row, steps, nominal), markup=False, highlight=False)
                bar.update(task, advance=1)
                for w in writers:
                    w.write(row)

            return train_worker(rank, world, job, on_step=both(on_step, watch), record=record, progress=progress,
                                log=log)
    finally:
        for w in writers:
            w.close()


def both(first, second):
    """An `on_step` that calls `first`, then `second` (either may be None)."""
    if first is None or second is None:
        return first or second

    def on_step(row: dict) -> None:
        first(row)
        second(row)

    return on_step


def cost_watch(job):
    """An `on_step` that prints one line on stderr when the cost model's estimates are off by more than
    `[train] cost_model_warn` over the first measured steps (runtime.calibration.CostModelWatch); None when off."""
    from tidal.runtime.calibration import CostModelWatch, cost_model_hint

    cfg = job.config
    if cfg.train.cost_model_warn <= 0:
        return None
    hint = cost_model_hint(cfg.planner.cost_model, {g.device.name for g in job.cluster.groups})
    watch = CostModelWatch(cfg.train.cost_model_warn, cfg.planner.cost_model or "analytic", hint=hint)

    def on_step(row: dict) -> None:
        line = watch.observe(row, last=row["step"] + 1 >= cfg.train.steps)
        if line:
            print(line, file=sys.stderr, flush=True)

    return on_step


def run_train(args) -> int:
    from tidal.cli import render
    from tidal.cli.configargs import overrides_of
    from tidal.runtime.config import load_config
    from tidal.runtime.job import prepare

    cfg = with_cache_dir(load_config(args.config, overrides_of(args)))
    env = _under_torchrun()
    if env is None and args.nproc is None:
        raise TidalError("give --nproc N to spawn ranks, or launch with torchrun")
    say = startup_log(cfg, env)

    def go(c, w):
        if env is not None and not getattr(args, "elastic", False):
            from tidal.cli.multinode import check_launch
            from tidal.core.cluster import get_cluster

            check_launch(os.environ, get_cluster(c.world.cluster))
        say(f"planning: validating {args.config} and building the candidate strategies for {w} ranks")
        job = prepare(c, w)
        say(f"candidates: {', '.join(map(str, job.candidates))}; "
            + (f"rank {env[0]} of {w} starting (torchrun)" if env else f"spawning {w} ranks"))
        return launch(job, train_entry, c.train.progress, False, nproc=None if env else w,
                      timeout_s=args.timeout, collective_timeout_s=c.train.collective_timeout_s,
                      grace_s=c.train.stop_grace_s, watch=True)

    if getattr(args, "elastic", False):
        from tidal.cli.elastic import run_elastic, torchrun_config

        if env is not None:
            cfg = torchrun_config(cfg, env[1])
        results = run_elastic(cfg, env[1] if env else args.nproc, 0 if env else args.max_restarts, go)
    else:
        results = go(cfg, env[1] if env else args.nproc)
    if results[0].rows:
        render.train_summary(render.console(), results[0].rows, cfg.train.metrics)
    if results[0].stop is not None:  # SIGTERM/SIGINT, or too many non-finite steps: exit code and one line
        from tidal.core.errors import RunFailure

        code, line = results[0].stop
        raise RunFailure(line, exit_code=code)
    return 0


def startup_log(cfg, env):
    """Start-up lines (cli/steplog.announcer) when this process reports: not under torchrun, or its rank 0; checks
    the `[train]` metric writers' packages first (one line, exit 2, before any rank starts)."""
    from tidal.cli import steplog, writers

    writers.check(cfg.train)
    if cfg.train.progress and (env is None or env[0] == 0):
        return steplog.announcer()
    return lambda line: None


def with_cache_dir(cfg):
    """Real corpora keep their token index under ~/.cache/tidal/corpora unless the config names a directory."""
    import dataclasses

    from tidal.cli.tokenizer import user_cache_dir

    if cfg.data.cache_dir:
        return cfg
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache_dir=str(user_cache_dir())))


def verify_config(args):
    import dataclasses

    from tidal.runtime.config import DataConfig, PlannerConfig, TrainConfig, TrainSection, WorldConfig, model_arg
    from tidal.runtime.optim import OptimConfig

    model = dataclasses.replace(model_arg(args.model), attn_backend="sdpa")
    planner = getattr(args, "planner", "tidal")
    if planner == "flexpipe":
        depths = getattr(args, "flexpipe_depths", None)
        if depths is None:
            top = min(args.nproc, model.spec().layers)
            depths = ",".join(str(2 ** i) for i in range(top.bit_length()) if 2 ** i <= top)
        pcfg = PlannerConfig(name="flexpipe", flexpipe_depths="" if depths == "hbsa" else depths)
    elif args.strategies is None:
        raise TidalError("verify needs --strategies (or --planner flexpipe)")
    else:
        pcfg = PlannerConfig(args.strategies, "hydraulis", "adaptive",
                             rotate=args.strategies.strip().lower() != "auto")
    return TrainConfig(
        model=model, world=WorldConfig(f"cpux{args.nproc}"),
        data=DataConfig(args.data, args.max_len, args.tokens_per_step, "split", args.seed),
        planner=pcfg,
        optimizer=OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=max(args.steps, 1)),
        train=TrainSection(args.steps, args.seed, "1f1b", "float32" if args.dtype == "bfloat16" else args.dtype,
                           args.dtype, "", False, cost_model_warn=0.0,  # verify checks numbers, not speed
                           recompute=args.recompute))


def replay_reference(job, rows: list[dict]):
    """The single-process run on the documents every step trained; returns (losses, state)."""
    import torch

    from tidal.runtime.job import open_corpus
    from tidal.runtime.reference import ReferenceTrainer

    cfg = job.config
    corpus = open_corpus(cfg, job.spec)
    ref = ReferenceTrainer(job.spec, seed=cfg.train.seed, dtype=getattr(torch, cfg.train.master_dtype),
                           optim=cfg.optimizer)
    losses = []
    for row in rows:
        docs = row["docs_run"]
        toks = [torch.from_numpy(np.asarray(corpus.tokens(d, s, n), dtype=np.int64)) for d, s, n in docs]
        losses.append(ref.train_step([n for _, _, n in docs], toks))
    return losses, ref.state()


def verify_report(rows: list[dict], ref_losses: list[float], dist_state: dict, ref_state: dict) -> dict:
    from tidal.runtime.reference import max_rel_diff

    loss = max((abs(r["loss"] - x) / abs(x) for r, x in zip(rows, ref_losses) if not math.isnan(x)), default=0.0)
    p, pn = max_rel_diff(dist_state["params"], ref_state["params"])
    m, mn = max_rel_diff(dist_state["m"], ref_state["m"])
    v, vn = max_rel_diff(dist_state["v"], ref_state["v"])
    return {"loss": loss, "params": p, "params_at": pn, "moments": max(m, v), "moments_at": mn if m >= v else vn}


def run_verify(args) -> int:
    from tidal.cli import render
    from tidal.cli.configargs import overrides_of
    from tidal.runtime.config import with_overrides
    from tidal.runtime.job import prepare

    if args.steps < 1 or args.nproc < 1:
        raise TidalError("--steps and --nproc must be >= 1")
    job = prepare(with_overrides(verify_config(args), overrides_of(args)), args.nproc)
    res = launch(job, train_entry, False, True, nproc=args.nproc, timeout_s=None,
                 collective_timeout_s=job.config.train.collective_timeout_s, watch=True)[0]
    ref_losses, ref_state = replay_reference(job, res.rows)
    rep = verify_report(res.rows, ref_losses, res.state, ref_state)
    tol = VERIFY_TOL[args.dtype]
    ok = rep["loss"] <= tol["loss"] and rep["params"] <= tol["params"] and rep["moments"] <= tol["moments"]
    render.verify_table(render.console(), res.rows, ref_losses, rep, tol, ok)
    return 0 if ok else 1
