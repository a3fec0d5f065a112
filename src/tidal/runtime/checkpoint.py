"""Checkpoints in torch.distributed.checkpoint (DCP) format, with per-file checksums verified on load.

Layout of a checkpoint directory (format ``tidal-checkpoint/2``, docs/training.md)::

    .metadata            DCP's global metadata (rank 0): every logical tensor's full shape and where its chunks lie
    __R_0.distcp         rank R's rows of every tensor (DCP FileSystemWriter, one file per rank)
    manifest.json        {"format", "model", "step", "optimizer_steps", "dtype", "world", "params", "keys", "state",
                          "config", "files": {name: {"bytes", "sha256"}}}   (written last: no manifest, no checkpoint)

Tensor keys are ``model.<parameter name>`` (master weights), ``optim.exp_avg.<name>`` and ``optim.exp_avg_sq.<name>``
(Adam moments), with the parameter names of ``core.model.param_table`` (Llama/HF-style FQNs). Each is one *logical*,
unsharded tensor of the model's full shape in DCP's metadata; rank R stores the rows it owns (``shard_range`` of dim
0, the executor's fully-sharded layout, independent of the strategy). A loader declares which block of each tensor it
wants (:class:`Region`) and DCP reads the overlapping chunks, so any world size loads any checkpoint, one process can
read one whole tensor (Hugging Face export), and a TP stage reads only its slice.

DCP's own tensor types (DTensor) split dim 0 like ``torch.chunk``; the executor's rows follow ``split_range`` (earlier
ranks take the remainder), so :class:`Region` implements DCP's ``_Checkpointable`` protocol for a block at an
arbitrary offset, with planners whose lookups resolve it (the documented extension points of DefaultSavePlanner and
DefaultLoadPlanner).

Saving (collective, :func:`begin_save`, then :func:`finish_save`): every rank writes its file into
``<path>.partial`` (synchronously, or with ``dcp.async_save`` on a dedicated gloo group, which stages a CPU copy and
writes in a background thread); then every rank hashes its own file, rank 0 gathers the hashes, writes
``manifest.json`` and renames the directory into place. :func:`verify` re-hashes every file the manifest lists and
names the first one that is missing, truncated or altered.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, ParamInfo, param_table

FORMAT = "tidal-checkpoint/2"
MANIFEST = "manifest.json"
PREFIX = {"params": "model", "m": "optim.exp_avg", "v": "optim.exp_avg_sq"}  # kind -> DCP key prefix
KINDS = tuple(PREFIX)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def key(kind: str, name: str) -> str:
    return f"{PREFIX[kind]}.{name}"


class Region:
    """This process's block of one logical tensor: `local` holds rows/columns starting at `offsets` of a tensor of
    shape `shape`. DCP's ``_Checkpointable`` protocol: it writes `local` as one chunk, and loads into `local` the
    parts of whatever chunks were saved that overlap it."""

    def __init__(self, local: torch.Tensor, offsets: Sequence[int], shape: Sequence[int]) -> None:
        if len(offsets) != local.dim() or len(shape) != local.dim():
            raise TidalError(f"region of rank {local.dim()} with offsets {tuple(offsets)} in shape {tuple(shape)}")
        self.local, self.offsets, self.shape = local, torch.Size(offsets), torch.Size(shape)

    def size(self) -> torch.Size:
        return self.shape

    def _chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=self.offsets, sizes=self.local.size())

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        del obj
        return [WriteItem(index=MetadataIndex(fqn, self.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=self._chunk(),
                                                      properties=TensorProperties.create_from_tensor(self.local),
                                                      size=self.shape))]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self._chunk()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        del index
        return self.local


def _resolve(state_dict: dict, index: MetadataIndex):
    obj = state_dict[index.fqn]
    return obj.local if isinstance(obj, Region) else None


class _SavePlanner(dcp.DefaultSavePlanner):
    def lookup_object(self, index: MetadataIndex):
        got = _resolve(self.state_dict, index)
        return super().lookup_object(index) if got is None else got


class _LoadPlanner(dcp.DefaultLoadPlanner):
    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        # DefaultLoadPlanner's set-up maps every value it does not know as a tensor type to None (torch 2.13,
        # planner_helpers._iterate_state_dict): put the regions back in the (flat) dicts it keeps
        regions = {k: v for k, v in state_dict.items() if isinstance(v, Region)}
        super().set_up_planner(state_dict, metadata, is_coordinator)
        for d in (state_dict, self.original_state_dict, self.state_dict):
            d.update(regions)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        got = _resolve(self.state_dict, index)
        return super().lookup_tensor(index) if got is None else got


def row_state(spec: ModelSpec, tensors: dict[str, Sequence[torch.Tensor]],
              row_ranges: Sequence[tuple[int, int]]) -> dict[str, Region]:
    """DCP state dict of a rank's rows: `tensors[kind][i]` holds rows `row_ranges[i]` of parameter i."""
    out = {}
    for kind, ts in tensors.items():
        for info, t, (r0, _) in zip(param_table(spec), ts, row_ranges):
            out[key(kind, info.name)] = Region(t, (r0,) + (0,) * (len(info.shape) - 1), info.shape)
    return out


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def prepare_dir(path: str | Path) -> None:
    """Rank 0, before a save: a fresh, empty ``<path>.partial``."""
    tmp = _partial(Path(path))
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)


def begin_save(path: str | Path, state: dict[str, Region], *, group=None, use_async: bool = False) -> Future | None:
    """Every rank, after `prepare_dir` and a barrier: write this rank's chunks into ``<path>.partial``. With
    `use_async`, ``dcp.async_save`` stages a CPU copy now and writes it in a background thread on `group` (a
    dedicated gloo group, so the writer's collectives never interleave with training's); returns its Future."""
    tmp = str(_partial(Path(path)))
    writer = dcp.FileSystemWriter(tmp, thread_count=1)
    if use_async:
        fut = dcp.async_save(state, storage_writer=writer, planner=_SavePlanner(), process_group=group)
        if hasattr(fut, "staging_completion"):  # the copy must be taken before the next step changes the tensors
            fut.staging_completion.result()
            return fut.upload_completion
        return fut
    dcp.save(state, storage_writer=writer, planner=_SavePlanner(), process_group=group)
    return None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _digest(path: Path, names: Sequence[str]) -> dict[str, dict]:
    return {n: {"bytes": (path / n).stat().st_size, "sha256": sha256(path / n)} for n in names}


def finish_save(path: str | Path, spec: ModelSpec, dtype: torch.dtype, *, rank: int, world: int, step: int,
                optimizer_steps: int, state: dict, config: dict | None = None, group=None) -> None:
    """Collective, after every rank's write completed: each rank hashes its own files (``__<rank>_*.distcp``), rank 0
    the metadata and any file no rank claimed; rank 0 writes manifest.json last and moves the directory into place."""
    path = Path(path)
    tmp = _partial(path)
    mine = _digest(tmp, sorted(p.name for p in tmp.glob(f"__{rank}_*.distcp")))
    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, mine, group=group)
    if rank == 0:
        files: dict[str, dict] = {}
        for p in parts:
            files.update(p)
        files.update(_digest(tmp, sorted(p.name for p in tmp.iterdir() if p.name not in files)))
        manifest = {"format": FORMAT, "model": dataclasses.asdict(spec), "step": int(step),
                    "optimizer_steps": int(optimizer_steps), "dtype": str(dtype).replace("torch.", ""),
                    "world": int(world),
                    "params": [{"name": i.name, "shape": list(i.shape)} for i in param_table(spec)],
                    "keys": PREFIX, "state": state, "config": config, "files": files}
        f = tmp / MANIFEST
        f.write_text(json.dumps(manifest, indent=1))
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
        old = path.with_name(path.name + ".old")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        if old.exists():
            shutil.rmtree(old)
    dist.barrier(group=group)


def load_meta(path: str | Path, spec: ModelSpec | None = None) -> dict:
    """manifest.json of a complete checkpoint, checked against `spec` (same parameter names and shapes). Does not
    hash the tensor files (see :func:`verify`)."""
    f = Path(path) / MANIFEST
    if not Path(path).is_dir():
        raise TidalError(f"{path}: no such checkpoint directory")
    try:
        meta = json.loads(f.read_text())
    except FileNotFoundError:
        if (Path(path) / "meta.json").exists():
            raise TidalError(f"{path}: format tidal-checkpoint/1 (meta.json), no longer read; this version reads "
                             f"{FORMAT} (decision 82)") from None
        raise TidalError(f"{path}: not a complete checkpoint (no {MANIFEST}: half-written)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TidalError(f"{f}: unreadable checkpoint manifest ({type(e).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise TidalError(f"{f}: format {got!r}, expected {FORMAT!r}")
    for k in ("step", "optimizer_steps", "dtype", "world", "params", "state", "files"):
        if k not in meta:
            raise TidalError(f"{f}: malformed manifest (no {k!r})")
    if spec is not None:
        want = [{"name": i.name, "shape": list(i.shape)} for i in param_table(spec)]
        if meta.get("params") != want:
            raise TidalError(f"{path}: checkpoint of model {meta.get('model', {}).get('name')!r} does not match "
                             f"model {spec.name} (parameter names or shapes differ)")
    return meta


def verify(path: str | Path, spec: ModelSpec | None = None) -> dict:
    """The manifest, after checking that every file it lists is present, of the recorded size and sha256; a
    TidalError naming the first file that is not."""
    meta = load_meta(path, spec)
    for name, want in sorted(meta["files"].items()):
        f = Path(path) / name
        if not f.is_file():
            raise TidalError(f"{f}: missing checkpoint file")
        size = f.stat().st_size
        if size != want["bytes"]:
            raise TidalError(f"{f}: truncated or extended ({size} bytes, manifest says {want['bytes']})")
        if sha256(f) != want["sha256"]:
            raise TidalError(f"{f}: corrupted (sha256 differs from the manifest)")
    return meta


def load_rows(path: str | Path, spec: ModelSpec, tensors: dict[str, Sequence[torch.Tensor]],
              row_ranges: Sequence[tuple[int, int]], *, group=None, no_dist: bool = False) -> None:
    """Collective (unless `no_dist`): fill `tensors[kind][i]` with rows `row_ranges[i]` of parameter i, whatever
    world size wrote the checkpoint."""
    state = row_state(spec, tensors, row_ranges)
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), planner=_LoadPlanner(),
                 process_group=group, no_dist=no_dist)
    except (dcp.CheckpointException, OSError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TidalError(f"{path}: cannot load checkpoint tensors ({first[:200]})") from None


def read_slice(path: str | Path, kind: str, index: int, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", spec: ModelSpec | None = None) -> torch.Tensor:
    """Rows [r0, r1) and columns [c0, c1) of tensor `index` of `kind`, read in this process alone (DCP no_dist):
    only the chunks that overlap the block are read."""
    meta = load_meta(path, spec)
    p = meta["params"][index]
    shape = tuple(p["shape"])
    r0, r1 = rows if rows is not None else (0, shape[0])
    offsets, size = [r0], [r1 - r0]
    if len(shape) > 1:
        c0, c1 = cols if cols is not None else (0, shape[1])
        offsets, size = offsets + [c0] + [0] * (len(shape) - 2), size + [c1 - c0] + list(shape[2:])
    local = torch.empty(size, dtype=DTYPES[meta["dtype"]])
    state = {key(kind, p["name"]): Region(local, offsets, shape)}
    try:
        with warnings.catch_warnings():  # "torch.distributed is disabled ... load in a single process": intended
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), planner=_LoadPlanner(), no_dist=True)
    except (dcp.CheckpointException, OSError, RuntimeError, ValueError) as e:
        raise TidalError(f"{path}: cannot read {key(kind, p['name'])} ({type(e).__name__})") from None
    return local.to(device=device, dtype=dtype)


def slice_source(path: str | Path) -> Callable[..., torch.Tensor]:
    """A drop-in for ``models.init.init_slice`` that reads the checkpoint's master weights instead of drawing them:
    ``source(info, index, rows, cols, dtype=, device=)``."""

    def source(info: ParamInfo, index: int, rows=None, cols=None, *, dtype=torch.float32, device="cpu"):
        del info
        return read_slice(path, "params", index, rows, cols, dtype=dtype, device=device)

    return source
