"""Optional metric writers for `tidal train` (issue 26 item 3): TensorBoard and Weights & Biases in offline mode.

``[train] tensorboard = "runs/tidal"`` writes TensorBoard event files there (``torch.utils.tensorboard``, which needs
the `tensorboard` package); ``[train] wandb = "offline"`` writes a W&B run under ``[train] wandb_dir`` (default: the
current directory's ``wandb/``), to upload later with ``wandb sync``; the project is ``[train] wandb_project``. Both
are imported lazily, on rank 0 only; :func:`check` runs before any rank starts and refuses a missing package with one
line. The writers log the numeric fields in `SCALARS` of every JSONL row (docs/training.md "Metrics") under
``train/<field>``, with the step (1-based) as the x axis; per-rank memory is logged as its maximum.

The module importer is a parameter (`importer`), so tests pass fake modules instead of patching imports.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

from tidal.core.errors import TidalError

SCALARS = ("loss", "tokens_per_s", "wall_s", "critical_path_s", "imbalance", "grad_norm", "lr", "mfu", "tokens",
           "documents", "est_step_time_s", "plan_wait_s", "checkpoint_s", "strategy_index")
WANDB_MODES = ("", "offline")

Importer = Callable[[str], object]


def scalars(row: dict) -> dict[str, float]:
    """The row's loggable numbers: `SCALARS` that are present and finite, and `peak_mem_gib` (the ranks' max)."""
    out = {}
    for k in SCALARS:
        v = row.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    if row.get("peak_mem_bytes"):
        out["peak_mem_gib"] = max(row["peak_mem_bytes"]) / 2**30
    return out


class TensorBoardWriter:
    """`SummaryWriter.add_scalar` per field, flushed every step (a killed job keeps what it logged)."""

    def __init__(self, logdir: str, importer: Importer = importlib.import_module) -> None:
        self.w = _load(importer, "torch.utils.tensorboard", "tensorboard", "[train] tensorboard").SummaryWriter(
            log_dir=logdir)

    def write(self, row: dict) -> None:
        step = int(row["step"]) + 1
        for k, v in scalars(row).items():
            self.w.add_scalar(f"train/{k}", v, global_step=step)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class WandbWriter:
    """`wandb.init(mode="offline")`, one `run.log` per step, `run.finish()` at the end."""

    def __init__(self, project: str, directory: str | None, config: dict | None,
                 importer: Importer = importlib.import_module) -> None:
        wandb = _load(importer, "wandb", "wandb", "[train] wandb")
        self.run = wandb.init(project=project, dir=directory or None, mode="offline", config=config)

    def write(self, row: dict) -> None:
        self.run.log({f"train/{k}": v for k, v in scalars(row).items()}, step=int(row["step"]) + 1)

    def close(self) -> None:
        self.run.finish()


def _load(importer: Importer, module: str, package: str, key: str):
    try:
        return importer(module)
    except ImportError as e:
        raise TidalError(f"{key} needs the {package} package ({' '.join(str(e).split())}): pip install {package}, "
                         f"or leave {key} empty") from None


def check(train, importer: Importer = importlib.import_module) -> None:
    """Refuse, before ranks start, a writer whose package is missing or a bad `wandb` mode (one line)."""
    if train.wandb not in WANDB_MODES:
        raise TidalError(f"[train] wandb must be \"offline\" or empty, got {train.wandb!r} (offline runs upload "
                         f"later with `wandb sync`)")
    if train.tensorboard:
        _load(importer, "torch.utils.tensorboard", "tensorboard", "[train] tensorboard")
    if train.wandb:
        _load(importer, "wandb", "wandb", "[train] wandb")


def open_writers(train, config: dict | None = None, importer: Importer = importlib.import_module) -> list:
    """The writers a `[train]` section asks for (rank 0 only)."""
    out: list = []
    if train.tensorboard:
        out.append(TensorBoardWriter(train.tensorboard, importer))
    if train.wandb:
        out.append(WandbWriter(train.wandb_project, train.wandb_dir, config, importer))
    return out
