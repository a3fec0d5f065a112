"""The training loop behind `tidal train`, `tidal verify` and `tidal demo`: one rank's loop over a prepared job.

The job is validated first, before any process group exists (`runtime.job.prepare`; re-exported here with the
job's other helpers, which tests and benchmarks import from this module). :func:`train_worker`
is one rank's loop: rank 0 gets each step's plan from the :class:`tidal.planner.stepper.StepPlanner`, inline or
computed ahead in a background process (`runtime.planahead`, ``[train] plan_ahead``), and broadcasts the step plan
and its documents (docs/decisions.md: one planner, no cross-rank determinism assumptions); every rank
fetches the tokens of the sequences its pipeline runs and calls :meth:`Executor.train_step`. Per-rank figures are
all-gathered so rank 0 writes one JSONL row per step (docs/training.md lists the fields).
"""

from __future__ import annotations

import json
import math
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tidal.core.errors import EXIT_NONFINITE
from tidal.core.plan import StepPlan
from tidal.costmodel.flops import mfu, peak_flops, train_flops
from tidal.planner.stepper import carry_state
from tidal.runtime import ckptdir
from tidal.runtime.calibration import OnlineRefit, calibration_fields
from tidal.runtime.config import nan_steps
from tidal.runtime.executor import Executor, fetch_from
from tidal.runtime.gcsync import StepGC
from tidal.runtime.groups import GroupCache
from tidal.runtime.guard import Progress, RankMarks
from tidal.runtime.job import (
    PROPOSAL_SAMPLE,
    Prepared,
    build_cost_model,
    make_ledger,
    make_planner,
    open_corpus,
    planner_spec,
    prepare,
    train_memory,
)
from tidal.runtime.launch import cuda_defaults
from tidal.runtime.lifecycle import StopRequest, exit_code_for
from tidal.runtime.planahead import SetCostModel, open_plans

__all__ = ["PROPOSAL_SAMPLE", "Prepared", "RunResult", "build_cost_model", "make_ledger", "make_planner",
           "open_corpus", "peak_memory_bytes", "planner_spec", "prepare", "save_checkpoint", "train_memory",
           "train_worker"]

_RANK_FIELDS = ("busy_s", "compute_busy_s", "process_busy_s", "wall_s", "pull_s", "push_s", "pull_cpu_s",
                "push_cpu_s", "pull_bytes", "push_bytes", "gc_s", "reconfigured", "moved_groups", "moved_recv_bytes",
                "moved_param_bytes", "extra_bytes")
_RECONFIG = _RANK_FIELDS[-5:]  # StepMetrics.reconfig's fields
_PICKED = ("sdpa", "flex")  # what attn_backend "mixed" picks per micro-batch (models/attention.pick_backend)


@dataclass(frozen=True)
class RunResult:
    rows: list[dict]  # one per step (rank 0; empty elsewhere)
    state: dict | None  # with record=True: full master params and Adam moments on rank 0 (Executor.gather_state)
    planner_state: dict | None = None  # rank 0: the planner's state as of the last step trained (resumes the stream)
    stop: tuple[int, str] | None = None  # why the run stopped early: (exit code, one line); None = it ran to the end


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """This rank's peak memory so far and what it counts: ("cuda", CUDA's `max_memory_allocated` on `device`), or
    ("rss", the process's peak resident set size from `getrusage`, on a CPU; it includes the interpreter and torch's
    libraries, about 0.3-0.4 GiB, so it is an upper bound on the training state, not comparable to the CUDA figure)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "rss"  # Linux: KiB


def train_worker(rank: int, world: int, job: Prepared, on_step: Callable[[dict], None] | None = None,
                 record: bool = False, plan_factory: Callable[[], object] | None = None,
                 plan_state: dict | None = None, progress: Progress | None = None,
                 log: Callable[[str], None] | None = None) -> RunResult:
    """One rank's training loop. With `record`, each row also lists the (doc_id, start, length) of every sequence
    trained that step (`docs_run`), and the final optimizer state is gathered, for replay by a reference.

    Rank 0 plans with `plan_factory()` (picklable; default: the job's `PlannerSpec`) resumed from `plan_state`, inline
    or `[train] plan_ahead` steps ahead in a background process started before the warm-up.

    Reliability (decisions 80-81): SIGTERM/SIGINT stop every rank at the same step boundary with a checkpoint (the
    flag travels in the per-step all-gather); a step with a non-finite loss or gradient on any rank is skipped on all
    ranks, and `[train] max_consecutive_skips` in a row stop the run (no checkpoint from such a streak). Each rank
    marks where it is in `progress` (the launcher names a rank that does not arrive at a collective).

    `log` (rank 0's, optional) gets one line per start-up phase, resume and completed checkpoint."""
    say = log if (log is not None and rank == 0) else (lambda line: None)
    torch.set_num_threads(1)  # ranks share the machine's cores; one intra-op thread each
    marks = RankMarks(progress, rank)
    stop = StopRequest(job.config.train.stop_grace_s, f"rank {rank}").install()
    if dist.get_backend() == "nccl":
        cuda_defaults(job.config.train.tf32)  # TF32 per [train] tf32 (run_distributed's ranks set it on first)
    cfg = job.config
    resume = None
    if cfg.train.resume:
        path = job.resume_from or ckptdir.resolve(cfg.train.checkpoint_dir, job.spec).path
        resume = (path, ckptdir.ckpt.load_meta(path, job.spec))
    done = 0 if resume is None else int(resume[1]["step"])  # steps trained so far (the checkpoint's)
    if resume is not None and rank == 0 and resume[1]["state"].get("planner") is not None:  # (none: HF import)
        # another strategy list or world: the stream carries over (one line)
        plan_state, note = (resume[1]["state"]["planner"], "") if cfg.planner.name == "flexpipe" else carry_state(
            resume[1]["state"]["planner"], job.options, job.candidates)
        if note:
            ckptdir.say(note)
    plans = (open_plans(plan_factory or planner_spec(job), cfg.train.plan_ahead, plan_state) if rank == 0
             else None)
    out = saver = None
    inject = nan_steps(cfg.train.inject_nan)
    skips = consecutive = 0
    halt: tuple[int, str] | None = None
    try:
        groups = GroupCache()
        executor = Executor(job.spec, job.cluster, job.candidates, job.exec_config, cfg.optimizer, groups)
        t_warm = time.perf_counter()
        say(f"warming up {len(job.candidates)} candidate strategies on {world} ranks ({dist.get_backend()})")
        executor.warm_up(min(256, cfg.data.max_len))  # first-use costs of each candidate, before any timed step
        say(f"warm-up done in {time.perf_counter() - t_warm:.1f} s")
        if resume is not None:
            t_load = time.perf_counter()
            executor.load_checkpoint(resume[0])
            say(f"resumed from {resume[0]} at step {done} ({time.perf_counter() - t_load:.1f} s)")
        if cfg.train.checkpoint_dir:  # a gloo group of its own, created here on every rank
            saver = ckptdir.Saver(cfg.train.checkpoint_dir, keep=cfg.train.keep_checkpoints,
                                  use_async=cfg.train.async_checkpoint, config=cfg.to_dict(), announce=say)
        corpus = open_corpus(cfg, job.spec)
        ledger = make_ledger(job, corpus) if rank == 0 else None
        if ledger is not None and resume is not None and resume[1]["state"].get("ledger") is not None:
            ledger.load_state_dict(resume[1]["state"]["ledger"])
        cost_model = job.cost_model() if rank == 0 else None  # the planner's model in force (calibration, refit)
        label = cfg.planner.cost_model or "analytic"
        refit = OnlineRefit(cost_model, every=cfg.train.refit_every) if (
            rank == 0 and cfg.train.refit == "online") else None
        if refit is not None and resume is not None and resume[1]["state"].get("refit") is not None:
            refit.load_state_dict(resume[1]["state"]["refit"])
            if refit.current is not None:  # plan on with the coefficients in force when the checkpoint was taken
                plans.apply(SetCostModel(refit.current))
                cost_model, label = refit.current, f"refit-{refit.generation}"
        rows: list[dict] = []
        mode = "a" if resume is not None else "w"  # a resumed run appends to its metrics, cut back to the checkpoint
        if rank == 0 and resume is not None and cfg.train.metrics:
            ckptdir.truncate_metrics(cfg.train.metrics, done)
        out = open(cfg.train.metrics, mode) if (rank == 0 and cfg.train.metrics) else None  # noqa: SIM115
        saved = done
        say(f"training steps {done + 1}-{cfg.train.steps}")
        picks_before = executor.attn_picks()  # the warm-up's micro-batches are not a step's
        with StepGC(cfg.train.gc_every) as sgc:  # Python's GC at step boundaries (decision 66)
            for _ in range(cfg.train.steps - done):
                t_loop = time.perf_counter()
                marks(done + 1, "plan broadcast")
                box = [None]
                if rank == 0:
                    ps = plans.next()
                    plan_wait_s = time.perf_counter() - t_loop  # planning on the critical path
                    if ps is not None:
                        box = [(ps.index, ps.plan.to_dict(), ps.docs, ps.token_delay)]
                        if ledger is not None:
                            ledger.record_planned(ps)
                dist.broadcast_object_list(box, src=0)
                if box[0] is None:
                    break
                index, plan_d, docs, delay = box[0]
                step = StepPlan.from_dict(plan_d)
                marks(done + 1, "train step")
                executor.probe = marks.probe(done + 1) or executor.probe
                poison = inject is not None and rank == inject[0] and inject[1] <= done + 1 <= inject[2]
                m = executor.train_step(step, fetch_from(docs, corpus), poison=poison)
                gc_s = sgc.after_step(done + 1)  # between steps on every rank, outside the timed regions
                marks(done + 1, "metrics all-gather")
                # per-rank figures, then this rank's stop request and non-finite flag (every rank reads every rank's)
                mem, mem_kind = peak_memory_bytes(executor.device)
                picks = executor.attn_picks()  # "mixed": micro-batches per backend this step (cumulative - before)
                step_picks = [picks.get(b, 0) - picks_before.get(b, 0) for b in _PICKED]
                picks_before = picks
                mine = torch.tensor([gc_s if f == "gc_s" else float(getattr(m.reconfig if f in _RECONFIG else m, f))
                                     for f in _RANK_FIELDS]
                                    + [mem, *step_picks, stop.signum, m.optim.get("local_bad", 0.0)],
                                    dtype=torch.float64, device=executor.device)
                every = [torch.zeros_like(mine) for _ in range(world)]
                dist.all_gather(every, mine)
                gathered = torch.stack(every).cpu().numpy()
                per_rank, signum = gathered[:, :len(_RANK_FIELDS)], int(gathered[:, -2].max())
                bad_ranks = [int(r) for r in np.flatnonzero(gathered[:, -1] > 0)]
                skipped = m.optim.get("skipped", 0.0) > 0  # the same on every rank (one all-reduce decided it)
                skips, consecutive = skips + skipped, (consecutive + 1 if skipped else 0)
                if rank == 0:
                    row = _row(index, step, job, m, per_rank, plans.plan_s, delay)
                    row.update(peak_mem_bytes=[int(x) for x in gathered[:, len(_RANK_FIELDS)]], mem_kind=mem_kind)
                    row.update(plan_cpu_s=plans.plan_cpu_s, plan_wait_s=plan_wait_s,
                               loop_s=time.perf_counter() - t_loop)
                    busy = per_rank[:, _RANK_FIELDS.index("compute_busy_s")]
                    row.update(calibration_fields(step, cost_model, [float(x) for x in busy], label))
                    if refit is not None and (new := refit.observe(row)) is not None:
                        plans.apply(SetCostModel(new))  # later steps are planned with the refitted coefficients
                        cost_model, label = new, f"refit-{refit.generation}"
                    row["attn_backend"] = executor.attn_backend
                    row["compile"] = executor.compile_mode
                    ran = gathered[:, len(_RANK_FIELDS) + 1 : len(_RANK_FIELDS) + 1 + len(_PICKED)].sum(axis=0)
                    if ran.any():  # per backend, micro-batches its stages ran this step, summed over ranks
                        row["attn_picks"] = {b: int(n) for b, n in zip(_PICKED, ran)}
                    # per pipeline of the step, the recomputation each stage ran (decision 90)
                    cand = job.candidates[step.strategy].pipelines
                    row["recompute"] = [[job.exec_config.stage_recompute(c.scheme, s) for s in range(c.scheme.pp)]
                                        for c in cand]
                    row["checkpoint_s"] = saver.take_blocked() if saver is not None else 0.0
                    row.update(skipped=bool(skipped), skips=skips, consecutive_skips=consecutive,
                               nonfinite_ranks=bad_ranks)
                    if ledger is not None:
                        row["data"] = ledger.counters()
                    if record:
                        row["docs_run"] = [list(docs[i]) for p in step.pipelines for mb in p.micro_batches for i in mb]
                    rows.append(row)
                    if out is not None:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                    if on_step is not None:
                        on_step(row)
                done += 1
                if saver is not None:
                    saver.step_done(done)  # completes an asynchronous save that overlapped this step
                if consecutive >= cfg.train.max_consecutive_skips:  # every rank: the same counts, the same decision
                    halt = (EXIT_NONFINITE, f"step {done}: {consecutive} non-finite steps in a row (loss or gradient "
                                            f"non-finite on rank(s) {bad_ranks}), max_consecutive_skips "
                                            f"{cfg.train.max_consecutive_skips}; stopped without a checkpoint"
                                            + _latest_note(cfg.train.checkpoint_dir))
                    break
                every = cfg.train.checkpoint_every
                due = (every and done % every == 0) or done == cfg.train.steps or signum
                if cfg.train.checkpoint_dir and due and consecutive == 0:  # never in a non-finite streak
                    marks(done, "checkpoint")
                    if not save_checkpoint(executor, cfg.train.checkpoint_dir, done, plans, ledger, refit,
                                           saver=saver):
                        halt = (EXIT_NONFINITE, f"step {done}: non-finite parameters or moments; checkpoint refused"
                                + _latest_note(cfg.train.checkpoint_dir))
                        break
                    saved = done
                if signum and done < cfg.train.steps:  # SIGTERM/SIGINT on a rank: every rank stops after this step
                    stop.finished()
                    what = (f"checkpoint {Path(cfg.train.checkpoint_dir) / f'step-{saved:06d}'} saved"
                            if cfg.train.checkpoint_dir and saved == done else "no checkpoint (no checkpoint_dir)"
                            if not cfg.train.checkpoint_dir else "no checkpoint (non-finite streak)")
                    halt = (exit_code_for(signum), f"stopped by {signal.Signals(signum).name} after step {done}: "
                                                   f"{what}")
                    break
        if halt is None and cfg.train.checkpoint_dir and saved != done:  # the corpus ended before `steps`
            marks(done, "checkpoint")
            if not save_checkpoint(executor, cfg.train.checkpoint_dir, done, plans, ledger, refit, saver=saver):
                halt = (EXIT_NONFINITE, f"step {done}: non-finite parameters or moments; checkpoint refused"
                        + _latest_note(cfg.train.checkpoint_dir))
        if saver is not None:
            saver.close()  # an asynchronous save in flight is completed (and `latest` moved) before the run ends
        planner_state = plans.state_dict() if rank == 0 else None
        marks(done, "finished")
    finally:
        stop.restore()
        if plans is not None:
            plans.close()
        if out is not None:
            out.close()
    state = executor.gather_state() if record else None
    return RunResult(rows, state, planner_state, halt)


def _latest_note(directory: str) -> str:
    if not directory:
        return ""
    try:
        return f"; latest is still {(Path(directory) / 'latest').read_text().strip()}"
    except OSError:
        return "; no checkpoint was written"


def save_checkpoint(executor: Executor, directory: str, step: int, plans, ledger,
                    refit: OnlineRefit | None = None, saver: ckptdir.Saver | None = None) -> bool:
    """Collective, at a step boundary: <directory>/step-NNNNNN (DCP, runtime/checkpoint.py) with every rank's rows,
    the planner's state as of the last step trained, the ledger's and the online refit's (rank 0); rank 0 points
    <directory>/latest at it once it is complete. With the run's `saver`, asynchronous if it is (finished at the next
    step boundary or `saver.close()`); without one, synchronous. Returns False, having written nothing, when any
    rank's parameters or moments are non-finite (one all-reduce decides it for all)."""
    finite = torch.tensor([1.0 if executor.optim.finite() else 0.0], dtype=torch.float64, device=executor.device)
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if float(finite) < 1.0:
        return False
    state = {}
    if plans is not None:
        state = {"planner": plans.state_dict(), "ledger": ledger.state_dict() if ledger is not None else None,
                 "refit": refit.state_dict() if refit is not None else None}
    own = saver is None
    if own:
        saver = ckptdir.Saver(directory, keep=0, use_async=False, own_group=False)
    saver.save(executor, step, state)
    if own:
        saver.close()
    return True


def _row(index: int, step: StepPlan, job: Prepared, m, per_rank: np.ndarray, plan_s: float, delay: float) -> dict:
    col = {f: per_rank[:, i] for i, f in enumerate(_RANK_FIELDS)}
    busy = col["busy_s"]
    wall = float(col["wall_s"].max())
    flops = train_flops(job.spec, (step.seq_lengths[i] for p in step.pipelines for mb in p.micro_batches for i in mb))
    return {
        "step": index,
        "strategy": str(job.candidates[step.strategy]),
        "strategy_index": step.strategy,
        "documents": m.sequences,
        "deferred": len(step.deferred),
        "tokens": m.tokens,
        "loss": m.loss,
        "wall_s": wall,
        "busy_s": [float(x) for x in busy],
        "critical_path_s": float(busy.max()),
        "imbalance": float(busy.max() / busy.mean()) if busy.mean() > 0 else 1.0,
        "compute_busy_s": [float(x) for x in col["compute_busy_s"]],
        "process_busy_s": [float(x) for x in col["process_busy_s"]],
        "process_critical_path_s": float(col["process_busy_s"].max()),
        "est_step_time_s": step.est_step_time,
        "lower_bound_s": step.lower_bound,
        "plan_s": plan_s,
        "token_delay": delay,
        "pull_s": float(col["pull_s"].max()),
        "push_s": float(col["push_s"].max()),
        "pull_cpu_s": [float(x) for x in col["pull_cpu_s"]],
        "push_cpu_s": [float(x) for x in col["push_cpu_s"]],
        "pull_bytes": int(col["pull_bytes"].sum()),
        "push_bytes": int(col["push_bytes"].sum()),
        "gc_s": float(col["gc_s"].max()),
        **_reconfig_fields(col),
        "grad_norm": m.optim.get("grad_norm", math.nan),
        "lr": m.optim.get("lr", math.nan),
        "tokens_per_s": m.tokens / wall if wall > 0 else 0.0,
        # the largest micro-batch's tokens, for the memory model's peak (benchmarks/gpu_run.py)
        "max_mb_tokens": max((sum(step.seq_lengths[i] for i in mb) for p in step.pipelines for mb in p.micro_batches),
                             default=0),
        "model_flops": flops,
        "mfu": mfu(flops, wall, peak_flops(job.cluster)),
    }


def _reconfig_fields(col: dict) -> dict:
    """A reconfiguration (candidate changed since the last step): groups whose holder changed, summed over ranks;
    the bytes received for them against their parameter bytes (ratio <= 1.0: pulls are at the minimum), the pull
    bytes it adds over keeping the old strategy, and its stall: the step's pull wall time (runtime/reconfig.py)."""
    on = bool(col["reconfigured"].max() > 0)
    moved, param = int(col["moved_recv_bytes"].sum()), int(col["moved_param_bytes"].sum())
    return {"reconfigured": on, "moved_groups": int(col["moved_groups"].sum()), "reconfig_bytes": moved,
            "moved_param_bytes": param, "reconfig_bytes_ratio": moved / param if param else 0.0,
            "reconfig_extra_bytes": int(col["extra_bytes"].sum()),
            "reconfig_stall_s": float(col["pull_s"].max()) if on else 0.0}
