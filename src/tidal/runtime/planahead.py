"""Planning ahead of training: plans of steps k+1, k+2, ... are computed in a background process while step k trains.

Hydraulis plans the next steps in background processes while the GPUs train (App. F); FlexPipe prefetches lengths so
its search runs ahead (§7). Here rank 0 gets its plans from a *plan stream*:

- :class:`InlinePlans` (``plan_ahead = 0``) calls the planner on the training thread, as before;
- :class:`BackgroundPlans` (``plan_ahead = D >= 1``) owns the same planner in a spawned process (not a thread: the
  planner is pure Python and would fight the training thread for the GIL; not fork: forking after torch and gloo
  started is unsafe). The process plans in order and puts each step into a queue of at most D plans, so it runs at
  most D + 1 steps ahead of training (D queued, one finished and waiting for a free slot).

Both build the planner with the same picklable, torch-free `factory` (:class:`PlannerSpec` for training), so the
stream of plans is the same whichever is used: every plan is a deterministic function of the planner's inputs and
state, never of when it was computed (a wall-clock ``budget_ms`` is the one exception, docs/decisions.md 32).

**State.** ``state_dict()`` is the planner state *as of the last step handed to the trainer*, not the run-ahead state
of the background process: the process sends the planner's ``state_dict()`` after each step with the step. A checkpoint
of it resumes exactly where training stopped (the plans still queued are recomputed by the resumed run).

**Requests.** The trainer talks to the process over a request queue. ``rewind(state, update)`` makes the process drop
whatever it planned ahead, load ``state`` (normally ``state_dict()``: the last consumed step), apply ``update(planner)``
(a picklable callable, e.g. one that swaps the cost model after an online refit) and plan on from there; plans already
queued under the old generation are discarded on arrival. So a planner change takes effect at exactly the step it
would take effect inline, at the price of one step planned on the critical path. ``apply(update)`` is that rewind to
the last consumed step; training's online refit sends ``apply(SetCostModel(refitted))``.

**Failures.** An exception in the planner (or in building it) travels to the trainer in order, at the step it
affects, and is raised there as :class:`BackgroundPlannerError`: one line with the exception and where it was raised,
the full traceback text in ``.traceback``. A process that dies without a word, or a plan that does not arrive within
``timeout_s``, is an error too, never a hang. ``close()`` (also on exceptions, via ``with``) stops the process, joins
it and terminates it if it does not stop; the process also dies with its parent (runtime/lifecycle.py), ``kill -9``
included, and ignores SIGINT (a terminal's Ctrl-C reaches the whole process group: the rank handles it).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.baselines.packings import PACKINGS
from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.strategy import Strategy
from tidal.costmodel.analytic import AnalyticCostModel, named_efficiency
from tidal.costmodel.loader import load_cost_model
from tidal.costmodel.memory import MemoryConfig
from tidal.costmodel.sync import SyncPricing
from tidal.data.corpus import corpus_from_spec
from tidal.data.sampler import TokenBudgetSampler
from tidal.planner.stepper import PlannedStep, PlanningOptions, StepPlanner
from tidal.runtime.lifecycle import die_with_parent

POLL_S = 0.1  # how often a waiting side checks that the other one is still alive
JOIN_S = 5.0  # how long close() waits for the process to stop before terminating it


@dataclass(frozen=True)
class StreamInputs:
    """The picklable, torch-free inputs every training planner samples and prices with: the corpus, the token budget
    sampler and the cost model. `PlannerSpec` (Tidal's planner) and `runtime.reconfig.FlexPipeSpec` add their own."""

    source: str  # corpus spec ([data] source)
    data_seed: int
    vocab: int
    tokenizer: str  # "" = UTF-8 bytes
    cache_dir: str
    tokens_per_step: int
    max_len: int
    long_docs: str
    cycle: bool
    cost_model: str  # "" = analytic; a name of `named_efficiency` or a file
    model: ModelSpec
    cluster: ClusterSpec
    candidates: tuple[Strategy, ...]

    def corpus(self):
        return corpus_from_spec(self.source, seed=self.data_seed, vocab=self.vocab, tokenizer=self.tokenizer or None,
                                cache_dir=self.cache_dir or None)

    def sampling(self, memory: MemoryConfig) -> tuple[TokenBudgetSampler, Any, Any]:
        """(the sampler over the corpus, the cost model, the corpus); the analytic model charges `memory`."""
        corpus = self.corpus()
        src = corpus.length_source()
        sampler = TokenBudgetSampler(src, self.tokens_per_step, self.max_len, long_docs=self.long_docs,
                                     seed=self.data_seed, cycle=self.cycle and src.size is not None)
        eff = named_efficiency(self.cost_model)
        cm = (load_cost_model(self.cost_model, self.model, self.cluster) if eff is None
              else AnalyticCostModel(self.model, self.cluster, eff, memory=memory))
        return sampler, cm, corpus


@dataclass(frozen=True)
class PlannerSpec(StreamInputs):
    """The picklable, torch-free inputs of training's planner; calling it builds a fresh :class:`StepPlanner`."""

    options: PlanningOptions
    memory: MemoryConfig = MemoryConfig()  # the analytic model's memory charge (tidal train: the executor's)
    sync: SyncPricing | None = None  # the pull/push the selection charges (StepPlanner's `sync`; decision 98)
    charge_cp: bool = False  # the selection charges CP kernel imbalance under options.cp_sharding

    def build(self) -> tuple[StepPlanner, Any]:
        """The planner and the corpus it samples."""
        sampler, cm, corpus = self.sampling(self.memory)
        return StepPlanner(cm, self.candidates, sampler, self.options, sync=self.sync,
                           charge_cp=self.charge_cp, packings=PACKINGS), corpus

    def __call__(self) -> StepPlanner:
        return self.build()[0]


class ReplayPlanner:
    """Replays planned steps computed earlier (planning "off": benchmarks compare against it). Its state is the
    number of steps replayed."""

    def __init__(self, steps: Sequence[PlannedStep]) -> None:
        self._steps = tuple(steps)
        self._i = 0

    def __call__(self) -> ReplayPlanner:  # a factory of itself (picklable with its steps)
        return ReplayPlanner(self._steps)

    def next(self) -> PlannedStep | None:
        if self._i >= len(self._steps):
            return None
        self._i += 1
        return self._steps[self._i - 1]

    def state_dict(self) -> dict:
        return {"replayed": self._i}

    def load_state_dict(self, d: dict) -> None:
        self._i = int(d["replayed"])


@dataclass(frozen=True)
class SetCostModel:
    """A planner update: plan the following steps with `cost_model` (`StepPlanner.set_cost_model`), e.g. the model
    an online refit produced. Picklable, so it can be sent to a background planner."""

    cost_model: Any

    def __call__(self, planner) -> None:
        planner.set_cost_model(self.cost_model)


class BackgroundPlannerError(TidalError):
    """The background planner raised, died or fell silent; `traceback` holds the planner's traceback text."""

    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback_text


def _one_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " < ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" + (f" (at {where})" if where else "")


def _timed_next(planner) -> tuple[PlannedStep | None, float, float]:
    t, c = time.perf_counter(), time.thread_time()
    ps = planner.next()
    return ps, time.perf_counter() - t, time.thread_time() - c


class InlinePlans:
    """``plan_ahead = 0``: the planner runs on the caller's thread when a step is asked for."""

    def __init__(self, factory: Callable[[], Any], state: dict | None = None) -> None:
        self.planner = factory()
        if state is not None:
            self.planner.load_state_dict(state)
        self.plan_s = 0.0  # the planner's wall time for the last step handed out
        self.plan_cpu_s = 0.0  # and its CPU time (thread_time)

    def next(self) -> PlannedStep | None:
        ps, self.plan_s, self.plan_cpu_s = _timed_next(self.planner)
        return ps

    def state_dict(self) -> dict:
        return self.planner.state_dict()

    def rewind(self, state: dict, update: Callable[[Any], None] | None = None) -> None:
        self.planner.load_state_dict(state)
        if update is not None:
            update(self.planner)

    def apply(self, update: Callable[[Any], None]) -> None:
        """Change the planner for the steps not handed out yet."""
        update(self.planner)

    def close(self) -> None:
        pass

    def __enter__(self) -> InlinePlans:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _put(out, item, parent) -> bool:
    """Put `item` (blocking while the queue is full); False if the parent died meanwhile."""
    while True:
        try:
            out.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            if parent is not None and not parent.is_alive():
                return False


def _serve(factory: Callable[[], Any], state: dict | None, requests, out) -> None:
    """The background process: plan in order into `out`; obey `requests` ("stop", ("rewind", gen, state, update))."""
    parent = mp.parent_process()
    # dies with its rank whatever kills the rank (decision 80); a terminal's Ctrl-C is the rank's to handle
    die_with_parent(parent.pid if parent is not None else None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gen = 0
    stopped = False
    try:
        planner = factory()
        if state is not None:
            planner.load_state_dict(state)
        pending: tuple | None = ("start", gen, planner.state_dict())
        ended = False
        while True:
            try:  # a request waits for the next slot; at the end of the stream, block on requests alone
                req = requests.get(timeout=POLL_S) if (ended and pending is None) else requests.get_nowait()
            except queue.Empty:
                req = None
            if req is not None:
                if req[0] == "stop":
                    stopped = True
                    break
                _, gen, st, update = req
                planner.load_state_dict(st)
                if update is not None:
                    update(planner)
                pending, ended = None, False
                continue
            if pending is None and not ended:
                ps, plan_s, cpu_s = _timed_next(planner)
                pending = ("step", gen, ps, planner.state_dict(), plan_s, cpu_s)
                ended = ps is None
            if pending is not None:
                try:
                    out.put(pending, timeout=POLL_S)
                    pending = None
                except queue.Full:
                    pass
            if parent is not None and not parent.is_alive():
                stopped = True
                break
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, in order
        stopped = not _put(out, ("error", gen, _one_line(e), traceback.format_exc()), parent)
    if stopped:  # never block exit on plans nobody will read (an error report is flushed: the trainer reads it)
        out.cancel_join_thread()


class BackgroundPlans:
    """``plan_ahead = depth >= 1``: a spawned process plans ahead into a queue of at most `depth` plans."""

    def __init__(self, factory: Callable[[], Any], depth: int, state: dict | None = None,
                 timeout_s: float = 600.0) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise TidalError(f"plan_ahead depth must be a positive integer, got {depth!r}")
        ctx = mp.get_context("spawn")
        self._requests = ctx.Queue()
        self._out = ctx.Queue(maxsize=depth)
        self._proc = ctx.Process(target=_serve, args=(factory, state, self._requests, self._out), daemon=True,
                                 name="tidal-planner")
        try:
            self._proc.start()
        except (pickle.PicklingError, AttributeError, TypeError) as e:  # a lambda, a local class, an open file ...
            for q in (self._requests, self._out):
                q.close()
            raise TidalError(f"the planner factory must be picklable to plan in a background process: {e}") from None
        self.depth, self.timeout_s = depth, timeout_s
        self._gen = 0
        self._state: dict | None = None  # as of the last consumed step (or the start)
        self._closed = False
        self._ended = False  # the stream returned None (until a rewind)
        self.plan_s = 0.0
        self.plan_cpu_s = 0.0

    def _poll(self, timeout: float) -> tuple | None:
        try:
            return self._out.get(timeout=timeout)
        except queue.Empty:
            return None

    def _get(self) -> tuple:
        """The next message of the current generation; raises on an error, a dead process or a timeout."""
        if self._closed:
            raise TidalError("the background planner is closed")
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._poll(POLL_S)
            if msg is None:
                if self._proc.is_alive():
                    if time.monotonic() <= deadline:
                        continue
                    self.close()
                    raise BackgroundPlannerError(f"no plan from the background planner within {self.timeout_s:g} s")
                msg = self._poll(1.0)  # it may have reported just before exiting
                if msg is None:
                    code = self._proc.exitcode
                    self.close()
                    raise BackgroundPlannerError(f"background planner process exited with code {code} without a "
                                                 f"plan")
            if msg[0] == "error":
                self.close()
                raise BackgroundPlannerError(f"background planner raised {msg[2]}", msg[3])
            if msg[1] == self._gen:
                return msg

    def _started(self) -> None:
        if self._state is None:
            msg = self._get()
            if msg[0] != "start":  # cannot happen: "start" is the first message of every generation-0 stream
                raise TidalError(f"background planner protocol: expected start, got {msg[0]}")
            self._state = msg[2]

    def next(self) -> PlannedStep | None:
        self._started()
        if self._ended:
            return None
        _, _, ps, state, self.plan_s, self.plan_cpu_s = self._get()
        self._state, self._ended = state, ps is None
        return ps

    def state_dict(self) -> dict:
        """The planner's state as of the last step handed out (not the process's run-ahead state)."""
        self._started()
        assert self._state is not None
        return self._state

    def rewind(self, state: dict, update: Callable[[Any], None] | None = None) -> None:
        """Drop the plans made ahead; continue from `state`, after `update(planner)` (picklable) if given."""
        self._started()
        self._gen += 1
        self._requests.put(("rewind", self._gen, state, update))
        self._state, self._ended = state, False

    def apply(self, update: Callable[[Any], None]) -> None:
        """Change the planner for the steps not handed out yet: a rewind to the last consumed step, then `update`."""
        self.rewind(self.state_dict(), update)

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def close(self) -> None:
        """Stop the process and join it (terminate, then kill, if it does not stop); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._proc.is_alive():
            self._requests.put(("stop",))
        deadline = time.monotonic() + JOIN_S
        while self._proc.is_alive() and time.monotonic() < deadline:
            self._poll(POLL_S)  # free a slot, so a process blocked putting a plan sees the request
        self._proc.join(timeout=POLL_S)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=JOIN_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        for q in (self._requests, self._out):
            q.cancel_join_thread()
            q.close()

    def __enter__(self) -> BackgroundPlans:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_plans(factory: Callable[[], Any], plan_ahead: int, state: dict | None = None,
               timeout_s: float = 600.0) -> InlinePlans | BackgroundPlans:
    """The plan stream of `factory`'s planner: inline for ``plan_ahead == 0``, else a background process."""
    if plan_ahead == 0:
        return InlinePlans(factory, state)
    return BackgroundPlans(factory, plan_ahead, state, timeout_s)
