"""Sharded checkpoints: every rank writes and reads only its rows, and any world size can load any checkpoint.

Layout of a checkpoint directory (format ``tidal-checkpoint/1``, docs/training.md)::

    meta.json            {"format", "model": ModelSpec fields, "step", "optimizer_steps", "dtype", "world",
                          "params": [{"name", "shape"}], "state": {...}}   (written last: no meta.json, no checkpoint)
    params/0000.npy      full master tensor of parameter 0 of core.model.param_table (numpy .npy, fp32 or fp64)
    m/0000.npy, v/0000.npy   Adam moments, same shapes

Every tensor is stored whole, in the unsharded model's layout, so the files do not depend on the strategy, the TP
degree or the world size that wrote them. Writing: rank 0 creates the files at their full size, then every rank
writes the rows it owns (its ``shard_range`` of dim 0) through a memory map; rank 0 writes ``meta.json`` after a
barrier and moves the finished directory into place, so an interrupted save never leaves a checkpoint that looks
complete. Reading goes through :func:`read_slice`, the same (rows, columns) interface as ``models.init.init_slice``:
the executor reads its master rows, a pipeline stage reads its TP shard, and no rank reads the whole model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, ParamInfo, param_table

FORMAT = "tidal-checkpoint/1"
KINDS = ("params", "m", "v")
_NP = {torch.float32: np.float32, torch.float64: np.float64}


def _file(path: Path, kind: str, index: int) -> Path:
    return path / kind / f"{index:04d}.npy"


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def create_files(path: str | Path, spec: ModelSpec, dtype: torch.dtype) -> None:
    """Rank 0, before any rank writes: a fresh ``<path>.partial`` directory with every tensor file at full size."""
    if dtype not in _NP:
        raise TidalError(f"checkpoints hold float32 or float64 master weights, not {dtype}")
    tmp = _partial(Path(path))
    if tmp.exists():
        shutil.rmtree(tmp)
    for kind in KINDS:
        (tmp / kind).mkdir(parents=True)
        for i, info in enumerate(param_table(spec)):
            np.lib.format.open_memmap(_file(tmp, kind, i), mode="w+", dtype=_NP[dtype], shape=info.shape).flush()


def write_rows(path: str | Path, kind: str, index: int, rows: tuple[int, int], value: torch.Tensor) -> None:
    """Every rank, after `create_files`: rows [r0, r1) of tensor `index` of `kind`."""
    mm = np.load(_file(_partial(Path(path)), kind, index), mmap_mode="r+")
    mm[rows[0] : rows[1]] = value.detach().cpu().numpy()
    mm.flush()
    del mm


def finish(path: str | Path, spec: ModelSpec, dtype: torch.dtype, *, step: int, optimizer_steps: int, world: int,
           state: dict) -> None:
    """Rank 0, after every rank has written: meta.json, then move the directory into place (replacing an old one)."""
    path = Path(path)
    tmp = _partial(path)
    meta = {"format": FORMAT, "model": dataclasses.asdict(spec), "step": int(step),
            "optimizer_steps": int(optimizer_steps), "dtype": str(dtype).replace("torch.", ""), "world": int(world),
            "params": [{"name": i.name, "shape": list(i.shape)} for i in param_table(spec)], "state": state}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    old = path.with_name(path.name + ".old")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)


def load_meta(path: str | Path, spec: ModelSpec | None = None) -> dict:
    """meta.json of a complete checkpoint, checked against `spec` (same parameter names and shapes)."""
    f = Path(path) / "meta.json"
    try:
        meta = json.loads(f.read_text())
    except FileNotFoundError:
        raise TidalError(f"{path}: not a complete checkpoint (no meta.json)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise TidalError(f"{f}: unreadable checkpoint metadata ({e})") from None
    if meta.get("format") != FORMAT:
        raise TidalError(f"{f}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if spec is not None:
        want = [{"name": i.name, "shape": list(i.shape)} for i in param_table(spec)]
        if meta.get("params") != want:
            raise TidalError(f"{path}: checkpoint of model {meta.get('model', {}).get('name')!r} does not match "
                             f"model {spec.name} (parameter names or shapes differ)")
    return meta


def read_slice(path: str | Path, kind: str, index: int, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows [r0, r1) and columns [c0, c1) of tensor `index` of `kind`; reads only those bytes (memory map)."""
    try:
        mm = np.load(_file(Path(path), kind, index), mmap_mode="r")
    except (OSError, ValueError) as e:
        raise TidalError(f"{_file(Path(path), kind, index)}: unreadable checkpoint tensor ({e})") from None
    r0, r1 = rows if rows is not None else (0, mm.shape[0])
    part = mm[r0:r1] if cols is None else mm[r0:r1, cols[0] : cols[1]]
    return torch.from_numpy(np.ascontiguousarray(part)).to(device=device, dtype=dtype)


def slice_source(path: str | Path) -> Callable[..., torch.Tensor]:
    """A drop-in for ``models.init.init_slice`` that reads the checkpoint's master weights instead of drawing them:
    ``source(info, index, rows, cols, dtype=, device=)``."""

    def source(info: ParamInfo, index: int, rows=None, cols=None, *, dtype=torch.float32, device="cpu"):
        del info
        return read_slice(path, "params", index, rows, cols, dtype=dtype, device=device)

    return source


def tensors_rows(path: str | Path, spec: ModelSpec, row_ranges: Sequence[tuple[int, int]], *,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[str, list[torch.Tensor]]:
    """For every kind, rows `row_ranges[i]` of every parameter i (a rank's fully-sharded optimizer state)."""
    n = len(param_table(spec))
    if len(row_ranges) != n:
        raise TidalError(f"give a row range per parameter ({n}), got {len(row_ranges)}")
    return {k: [read_slice(path, k, i, row_ranges[i], dtype=dtype, device=device) for i in range(n)] for k in KINDS}
