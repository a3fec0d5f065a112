"""Predicted vs measured time per pipeline and per step, the metrics rows that carry them, and the online refit.

What is compared (docs/training.md, "Calibration"): the cost model's T is a micro-batch's forward + backward on the
scheme's slowest stage, measured as CPU time (`tidal profile`). So for a pipeline that runs micro-batches j = 1..V in
a step,

* predicted = sum_j T_j (the work of its slowest stage, bubbles excluded: a rank waiting on a receive uses no CPU);
* measured  = max over the pipeline's ranks of `compute_busy_s` (that rank's CPU time in forward and backward; on
  CUDA their GPU time from CUDA events, decision 141);

and per step, predicted = max over pipelines of predicted, measured = max over ranks of `compute_busy_s`.
Pull, push and the optimizer step are not in T and not in either figure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import StepPlan
from tidal.core.scheme import ParallelScheme, parse_scheme
from tidal.core.strategy import Pipeline
from tidal.costmodel.base import CostModel, pipeline_device
from tidal.costmodel.fitted import FittedCostModel, fits_from_json, fits_to_json
from tidal.costmodel.refit import PipelineObs, refit_model, with_fits

REFIT_MODES = ("off", "online")


def pipeline_scheme(p, layers: int) -> ParallelScheme:
    """The scheme of a PipelinePlan as the planner costed it: a layer split equal to the even split is dropped
    (plans record the split; candidates and fitted models name the plain scheme)."""
    return plain_scheme(ParallelScheme(p.tp, p.pp, p.cp, p.layer_split), layers)


def plain_scheme(s: ParallelScheme, layers: int) -> ParallelScheme:
    if s.layer_split is not None and s.layer_split == ParallelScheme(s.tp, s.pp, s.cp).stage_layers(layers):
        return ParallelScheme(s.tp, s.pp, s.cp)
    return s


def calibration_fields(step: StepPlan, cost_model: CostModel, compute_busy: Sequence[float], label: str) -> dict:
    """The metrics-row fields of one step: per pipeline (with work) its features, predicted and measured seconds,
    and the step's maxima. `compute_busy[r]` is rank r's forward + backward CPU time."""
    pipes = []
    for p in step.pipelines:
        if not p.micro_batches:
            continue
        scheme = pipeline_scheme(p, cost_model.model.layers)
        co = cost_model.coeffs(scheme, pipeline_device(cost_model.cluster, Pipeline(scheme, p.devices)))
        mbs = [[step.seq_lengths[i] for i in mb] for mb in p.micro_batches]
        pipes.append({
            "scheme": str(scheme),
            "ranks": list(p.devices),
            "micro_batches": len(mbs),
            "sum_len": int(sum(sum(m) for m in mbs)),
            "sum_sq": int(sum(x * x for m in mbs for x in m)),
            "docs": int(sum(len(m) for m in mbs)),
            "predicted_s": float(sum(co.mb_time(m) for m in mbs)),
            "measured_s": float(max(compute_busy[r] for r in p.devices)),
        })
    return {
        "cost_model": label,
        "predicted_s": max((p["predicted_s"] for p in pipes), default=0.0),
        "measured_s": float(max(compute_busy)) if pipes else 0.0,
        "pipelines": pipes,
    }


def observations(row: dict) -> list[PipelineObs]:
    return [PipelineObs(p["scheme"], float(p["sum_sq"]), float(p["sum_len"]), int(p["micro_batches"]),
                        float(p["measured_s"]), int(p.get("docs", 0))) for p in row.get("pipelines", ())
            if p["measured_s"] > 0]


class OnlineRefit:
    """Collects per-pipeline observations of measured steps and, every `every` steps, refits the coefficients of
    the schemes with enough of them (`costmodel.refit.refit_model`, Huber-robust, prior = the starting model).
    Keeps the last `window` observations per scheme. Deterministic in the rows it is given."""

    def __init__(self, base: CostModel, every: int = 5, min_rows: int = 6, window: int = 256) -> None:
        if every < 1 or window < min_rows:
            raise TidalError(f"online refit needs every >= 1 and window >= min_rows, got {every}, {window}")
        self.base, self.every, self.min_rows, self.window = base, every, min_rows, window
        self.obs: dict[str, list[PipelineObs]] = {}
        self.generation = 0
        self.current: FittedCostModel | None = None  # the model of the last refit (the one in force), if any
        self._seen = 0

    def observe(self, row: dict) -> CostModel | None:
        """Record one step's row; returns a refitted model when one is due (None otherwise)."""
        for o in observations(row):
            kept = self.obs.setdefault(o.scheme, [])
            kept.append(o)
            del kept[:-self.window]
        self._seen += 1
        if self._seen % self.every or not any(len(v) >= self.min_rows for v in self.obs.values()):
            return None
        self.generation += 1
        self.current = refit_model(self.base, [o for k in sorted(self.obs) for o in self.obs[k]],
                                   min_rows=self.min_rows)
        return self.current

    def state_dict(self) -> dict:
        """JSON-safe: the kept observations, the step count and the model in force, so a resumed run plans with the
        refitted coefficients and refits on the same schedule from the same observations as an uninterrupted one."""
        return {"seen": self._seen, "generation": self.generation,
                "obs": {k: [[o.sum_sq, o.sum_len, o.micro_batches, o.seconds, o.docs] for o in v]
                        for k, v in sorted(self.obs.items())},
                "model": None if self.current is None else fits_to_json(self.current.fits)}

    def load_state_dict(self, d: dict) -> None:
        try:
            obs = {str(k): [PipelineObs(str(k), float(a), float(b), int(v), float(t), int(n)) for a, b, v, t, n in rows]
                   for k, rows in d["obs"].items()}
            seen, generation, model = int(d["seen"]), int(d["generation"]), d["model"]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TidalError(f"malformed online-refit state in checkpoint: {type(e).__name__}: {e}") from None
        where = "online-refit state in checkpoint"
        current = None if model is None else with_fits(self.base, fits_from_json(model, where))
        self.obs, self._seen, self.generation, self.current = obs, seen, generation, current


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a `tidal train` metrics file; bad input raises TidalError naming the file and line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TidalError(f"cannot read metrics {p}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TidalError(f"metrics {p} is not a UTF-8 JSONL file") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TidalError(f"{p}:{n}: malformed JSON: {e.msg}") from None
        if not isinstance(row, dict):
            raise TidalError(f"{p}:{n}: a metrics row must be a JSON object")
        for key in ("predicted_s", "measured_s", "pipelines"):
            if key not in row:
                raise TidalError(f"{p}:{n}: missing field {key!r} (metrics written without calibration fields?)")
        _check_row(row, f"{p}:{n}")
        rows.append(row)
    if not rows:
        raise TidalError(f"{p}: no metrics rows")
    return rows


def _check_row(row: dict, where: str) -> None:
    if not isinstance(row["pipelines"], list):
        raise TidalError(f"{where}: 'pipelines' must be a list")
    for q in row["pipelines"]:
        if not isinstance(q, dict):
            raise TidalError(f"{where}: a pipeline entry must be an object")
        for key in ("scheme", "predicted_s", "measured_s", "micro_batches", "sum_len", "sum_sq"):
            if key not in q:
                raise TidalError(f"{where}: a pipeline entry lacks {key!r}")
    values = [row["predicted_s"], row["measured_s"]] + [q[k] for q in row["pipelines"]
                                                          for k in ("predicted_s", "measured_s", "sum_len", "sum_sq")]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values):
        raise TidalError(f"{where}: predicted and measured times and features must be finite numbers >= 0")


def repredict(rows: list[dict], cost_model: CostModel) -> list[dict]:
    """The rows with predictions recomputed by another cost model (features are exact: sum_j T_j =
    a * sum_sq + b * sum_len + c * V + d * docs). Rows written before the `docs` field existed can only be
    re-predicted by a model without a per-document term."""
    out = []
    for row in rows:
        pipes = []
        for q in row["pipelines"]:
            scheme = plain_scheme(parse_scheme(q["scheme"]), cost_model.model.layers)
            devices = tuple(q.get("ranks") or range(scheme.num_devices))
            co = cost_model.coeffs(scheme, pipeline_device(cost_model.cluster, Pipeline(scheme, devices)))
            pred = co.a * q["sum_sq"] + co.b * q["sum_len"] + co.c * q["micro_batches"]
            if co.d:
                if "docs" not in q:
                    raise TidalError(f"a pipeline row has no 'docs' count, needed by the per-document term d of "
                                     f"{q['scheme']}; re-run tidal train to record it")
                pred += co.d * q["docs"]
            pipes.append({**q, "predicted_s": float(pred)})
        out.append({**row, "pipelines": pipes, "predicted_s": max((q["predicted_s"] for q in pipes), default=0.0)})
    return out


def abs_rel_errors(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """|predicted - measured| / measured over (predicted, measured) pairs with measured > 0."""
    return np.array([abs(p - m) / m for p, m in pairs if m > 0], dtype=np.float64)


def calibration_stats(rows: list[dict], skip: int = 0) -> dict:
    """Median and p90 of the absolute relative error, per step and per pipeline, after the first `skip` rows."""
    use = rows[skip:]
    if not use:
        raise TidalError(f"no metrics rows left after skipping {skip}")
    steps = [(float(r["predicted_s"]), float(r["measured_s"])) for r in use if r["pipelines"]]
    pipes = [(float(q["predicted_s"]), float(q["measured_s"])) for r in use for q in r["pipelines"]]
    out: dict = {"steps": len(steps), "pipelines": len(pipes)}
    for name, pairs in (("step", steps), ("pipeline", pipes)):
        err = abs_rel_errors(pairs)
        if err.size == 0:
            raise TidalError("no step with a measured time to calibrate against")
        ratio = np.array([p / m for p, m in pairs if m > 0])
        out[name] = {"median": float(np.median(err)), "p90": float(np.percentile(err, 90)),
                     "max": float(err.max()), "bias": float(np.median(ratio) - 1.0)}
    by: dict[str, list[tuple[float, float]]] = {}
    for r in use:
        for q in r["pipelines"]:
            by.setdefault(q["scheme"], []).append((float(q["predicted_s"]), float(q["measured_s"])))
    out["by_scheme"] = {k: {"n": len(v), "median": float(np.median(abs_rel_errors(v))),
                            "p90": float(np.percentile(abs_rel_errors(v), 90))} for k, v in sorted(by.items())}
    return out


class CostModelWatch:
    """Warns once when the cost model in use is off (decision 87): after the first `skip` measured steps (first-use
    costs), over the next `window` ones, the median of measured / predicted compute time (the calibration fields
    above) is above 1 + tolerance or below 1 / (1 + tolerance). `observe(row, last)` returns the one-line warning at
    most once (with `last`, a run shorter than skip + window is judged on what it measured); None otherwise. `hint`
    ends the warning (a model known to fit this device better)."""

    def __init__(self, tolerance: float, label: str = "analytic", skip: int = 1, window: int = 3,
                 hint: str = "") -> None:
        self.tolerance, self.label, self.skip, self.window, self.hint = tolerance, label, skip, window, hint
        self.ratios: list[float] = []
        self.seen = 0
        self.done = tolerance <= 0

    def observe(self, row: dict, last: bool = False) -> str | None:
        if self.done:
            return None
        pred, meas = float(row.get("predicted_s", 0.0)), float(row.get("measured_s", 0.0))
        if pred > 0 and meas > 0 and not row.get("skipped"):
            self.seen += 1
            if self.seen > self.skip:
                self.ratios.append(meas / pred)
        if len(self.ratios) < self.window and not (last and self.ratios):
            return None
        self.done = True
        r = float(np.median(self.ratios))
        if 1 / (1 + self.tolerance) <= r <= 1 + self.tolerance:
            return None
        first = self.skip + 1
        span = f"step {first}" if len(self.ratios) == 1 else f"steps {first}-{first + len(self.ratios) - 1}"
        return (f"tidal train: warning: the cost model ({self.label}) is off: measured compute time is {r:.2f}x its "
                f"estimate (median of {span}; tolerance {self.tolerance:.0%}), so plans may be far from the best; "
                f"profile this machine with `tidal profile` and set [planner] cost_model, or [train] refit = "
                f"\"online\"" + (f"; {self.hint}" if self.hint else ""))


HOPPER = ("h100", "h800", "h200", "h20")


def cost_model_hint(cost_model: str, device_types: set[str]) -> str:
    """What to plan with instead, where it is known (decision 158): the pools' `analytic` model on Hopper devices
    predicts 0.62x of Tidal's default runtime's compute on an H200; `analytic-eager-mixed` 1.02x."""
    if (cost_model or "analytic").strip().lower() == "analytic" and device_types and device_types <= set(HOPPER):
        return ('on Hopper with the default runtime (mixed attention, compiled dense parts), [planner] cost_model = '
                '"analytic-eager-mixed" predicted an H200\'s measured compute within 2 % at the median (decision 158)')
    return ""

