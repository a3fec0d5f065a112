"""Plan: per step, the chosen strategy and where every sequence goes. JSON round trip; see docs/plan-format.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tidal.core.errors import TidalError

FORMAT = "tidal-plan/1"


@dataclass(frozen=True)
class PipelinePlan:
    tp: int
    pp: int
    cp: int
    devices: tuple[int, ...]
    max_len: int
    micro_batches: tuple[tuple[int, ...], ...]  # indices into the step's seq_lengths
    est_time: float  # seconds, forward+backward of the whole pipeline for this step
    cp_sharding: tuple[str, ...] = ()  # per micro-batch: "per-doc" or "per-seq" (empty when cp == 1)
    layer_split: tuple[int, ...] | None = None

    def to_dict(self) -> dict:
        d = {
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "devices": list(self.devices),
            "max_len": self.max_len,
            "micro_batches": [list(mb) for mb in self.micro_batches],
            "est_time": self.est_time,
            "cp_sharding": list(self.cp_sharding),
        }
        if self.layer_split is not None:
            d["layer_split"] = list(self.layer_split)
        return d

    @staticmethod
    def from_dict(d: dict) -> PipelinePlan:
        split = d.get("layer_split")
        return PipelinePlan(
            tp=int(d["tp"]),
            pp=int(d["pp"]),
            cp=int(d["cp"]),
            devices=tuple(int(x) for x in d["devices"]),
            max_len=int(d["max_len"]),
            micro_batches=tuple(tuple(int(i) for i in mb) for mb in d["micro_batches"]),
            est_time=float(d["est_time"]),
            cp_sharding=tuple(str(s) for s in d.get("cp_sharding", ())),
            layer_split=tuple(int(x) for x in split) if split is not None else None,
        )


@dataclass(frozen=True)
class StepPlan:
    seq_ids: tuple[int, ...]  # positions in the data stream
    seq_lengths: tuple[int, ...]
    strategy: int  # index into Plan.candidates
    pipelines: tuple[PipelinePlan, ...]
    deferred: tuple[int, ...]  # indices carried to a later step (WLB outlier queues); never dropped
    est_step_time: float
    lower_bound: float
    plan_ms: float = 0.0  # wall-clock planning time; the only non-deterministic field

    def to_dict(self, timings: bool = True) -> dict:
        return {
            "seq_ids": list(self.seq_ids),
            "seq_lengths": list(self.seq_lengths),
            "strategy": self.strategy,
            "pipelines": [p.to_dict() for p in self.pipelines],
            "deferred": list(self.deferred),
            "est_step_time": self.est_step_time,
            "lower_bound": self.lower_bound,
            "plan_ms": self.plan_ms if timings else 0.0,
        }

    @staticmethod
    def from_dict(d: dict) -> StepPlan:
        return StepPlan(
            seq_ids=tuple(int(x) for x in d["seq_ids"]),
            seq_lengths=tuple(int(x) for x in d["seq_lengths"]),
            strategy=int(d["strategy"]),
            pipelines=tuple(PipelinePlan.from_dict(p) for p in d["pipelines"]),
            deferred=tuple(int(x) for x in d.get("deferred", ())),
            est_step_time=float(d["est_step_time"]),
            lower_bound=float(d["lower_bound"]),
            plan_ms=float(d.get("plan_ms", 0.0)),
        )

    @property
    def gap(self) -> float:
        """est_step_time / lower_bound - 1 (0 for an empty step)."""
        return self.est_step_time / self.lower_bound - 1.0 if self.lower_bound > 0 else 0.0


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    candidates: tuple[str, ...]  # strategy strings, see core.scheme.parse_strategy
    steps: tuple[StepPlan, ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self, timings: bool = True) -> dict:
        return {
            "format": FORMAT,
            "model": self.model,
            "cluster": self.cluster,
            "meta": self.meta,
            "candidates": list(self.candidates),
            "steps": [s.to_dict(timings) for s in self.steps],
        }

    def to_json(self, timings: bool = True) -> str:
        return json.dumps(self.to_dict(timings), indent=1, sort_keys=False)

    @staticmethod
    def from_dict(d: dict) -> Plan:
        if d.get("format") != FORMAT:
            raise TidalError(f"not a Tidal plan: format is {d.get('format')!r}, expected {FORMAT!r}")
        try:
            return Plan(
                model=str(d["model"]),
                cluster=str(d["cluster"]),
                candidates=tuple(str(c) for c in d["candidates"]),
                steps=tuple(StepPlan.from_dict(s) for s in d["steps"]),
                meta=dict(d.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TidalError(f"malformed plan: {type(e).__name__}: {e}") from None

    @staticmethod
    def from_json(text: str) -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TidalError(f"malformed plan JSON: {e}") from None
        if not isinstance(d, dict):
            raise TidalError("malformed plan JSON: top level is not an object")
        return Plan.from_dict(d)

    @staticmethod
    def load(path: str | Path) -> Plan:
        try:
            return Plan.from_json(Path(path).read_text())
        except OSError as e:
            raise TidalError(f"cannot read plan {path}: {e.strerror}") from None
