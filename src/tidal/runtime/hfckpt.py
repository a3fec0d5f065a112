"""Hugging Face Llama directory <-> Tidal checkpoint (runtime/checkpoint.py's DCP format), in one process.

:func:`import_hf` writes ``OUT/step-000000`` (master weights upcast to the master dtype, Adam moments zero, step 0,
optimizer step 0, no planner state: a resume starts a fresh data stream and warm-up from these weights), points
``OUT/latest`` at it, copies ``tokenizer.json`` when the source has one and writes ``OUT/train.toml`` (the model's
shape in ``[model]``; ``[train] checkpoint_dir = OUT, resume = true``). :func:`export_hf` reads a checkpoint's master
weights (any world size wrote it) and writes config.json, model.safetensors and tokenizer.json when known. Decision 84.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.models import hf
from tidal.runtime import checkpoint as ckpt
from tidal.runtime import ckptdir

TOKENIZER = "tokenizer.json"


def _name(src: Path) -> str:
    n = re.sub(r"[^A-Za-z0-9_.-]+", "-", src.resolve().name).strip("-.").lower()
    return n or "hf-llama"


def write_single(path: str | Path, spec: ModelSpec, tensors: dict[str, dict[str, torch.Tensor]], dtype: torch.dtype,
                 *, step: int, optimizer_steps: int, state: dict, config: dict | None) -> None:
    """A complete checkpoint written by one process (world 1): `tensors[kind][name]` full tensors of `dtype`."""
    path = Path(path)
    ckpt.prepare_dir(path)
    tmp = path.with_name(path.name + ".partial")
    shard = {ckpt.key(kind, i.name): ckpt.Region(ts[i.name].to(dtype).contiguous(), (0,) * len(i.shape), i.shape)
             for kind, ts in tensors.items() for i in param_table(spec)}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... in a single process": intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(shard, storage_writer=dcp.FileSystemWriter(str(tmp), thread_count=1), planner=ckpt._SavePlanner(),
                 no_dist=True)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": ckpt.sha256(p)} for p in sorted(tmp.iterdir())}
    manifest = {"format": ckpt.FORMAT, "model": dataclasses.asdict(spec), "step": int(step),
                "optimizer_steps": int(optimizer_steps), "dtype": str(dtype).replace("torch.", ""), "world": 1,
                "params": [{"name": i.name, "shape": list(i.shape)} for i in param_table(spec)],
                "keys": ckpt.PREFIX, "state": state, "config": config, "files": files}
    (tmp / ckpt.MANIFEST).write_text(json.dumps(manifest, indent=1))
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def train_toml(spec: ModelSpec, out: Path, tokenizer: str) -> str:
    s = spec
    lines = ["# written by `tidal import hf`; add [world], [data], [planner] and [train] settings (docs/training.md)",
             "[model]", f'name = "{s.name}"', f"layers = {s.layers}", f"hidden = {s.hidden}", f"heads = {s.heads}",
             f"kv_heads = {s.kv_heads}", f"ffn = {s.ffn}", f"vocab = {s.vocab}", f"rope_theta = {s.rope_theta!r}",
             f"norm_eps = {s.norm_eps!r}", f"tie_embeddings = {'true' if s.tie_embeddings else 'false'}", ""]
    if tokenizer:
        lines += ["[data]", f"tokenizer = {json.dumps(tokenizer)}", ""]
    lines += ["[train]", f"checkpoint_dir = {json.dumps(str(out))}", "resume = true", ""]
    return "\n".join(lines)


def import_hf(src: str | Path, out: str | Path, *, name: str = "", master_dtype: str = "float32") -> dict:
    """Read the HF Llama directory `src` into the checkpoint directory `out` (see module doc). Returns a summary."""
    src, out = Path(src), Path(out)
    if master_dtype not in ckpt.DTYPES:
        raise TidalError(f"master dtype {master_dtype!r}; choose one of {', '.join(ckpt.DTYPES)}")
    if not src.is_dir():
        raise TidalError(f"{src}: no such directory")
    cfg = hf.read_config(src)
    spec = hf.spec_from_hf_config(cfg, name or _name(src))
    weights, stored = hf.read_weights(src, spec)
    if out.exists() and any(out.iterdir()):
        raise TidalError(f"{out} exists and is not empty; import writes a new checkpoint directory")
    out.mkdir(parents=True, exist_ok=True)
    dtype = ckpt.DTYPES[master_dtype]
    zeros = {n: torch.zeros(t.shape, dtype=dtype) for n, t in weights.items()}
    tok = ""
    if (src / TOKENIZER).is_file():
        shutil.copyfile(src / TOKENIZER, out / TOKENIZER)
        tok = str((out / TOKENIZER).resolve())
    toml = train_toml(spec, out.resolve(), tok)
    step_dir = out / ckptdir.step_name(0)
    write_single(step_dir, spec, {"params": weights, "m": zeros, "v": dict(zeros)}, dtype, step=0,
                 optimizer_steps=0, state={"hf": {"dtype": stored, "config": cfg}}, config=None)
    ckptdir.publish(out, 0)
    (out / "train.toml").write_text(toml)
    return {"model": spec, "checkpoint": str(step_dir), "dtype": stored, "tokenizer": tok,
            "config": str(out / "train.toml")}


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint (a directory with manifest.json), or the one a checkpoint directory's ``latest`` names."""
    p = Path(path)
    if (p / ckpt.MANIFEST).is_file() or not p.is_dir() or p.name.startswith("step-"):
        return p  # verify names what is wrong with it
    if not (p / "latest").is_file() and not ckptdir.checkpoints(p):
        raise TidalError(f"{p}: not a checkpoint (no manifest.json) nor a checkpoint directory (no latest, no step-*)")
    res = ckptdir.resolve(p, None)
    if res.note:
        ckptdir.say(res.note)
    return Path(res.path)


def export_hf(path: str | Path, out: str | Path, *, dtype: str = "") -> dict:
    """Write checkpoint `path`'s master weights as an HF Llama directory `out` (config.json, model.safetensors,
    tokenizer.json when the checkpoint directory has one). `dtype` "" = the imported model's dtype, else float32."""
    p = checkpoint_path(path)
    meta = ckpt.verify(p)
    try:
        spec = ModelSpec(**meta["model"])
    except (TypeError, KeyError):
        raise TidalError(f"{p}: manifest has no usable model shape") from None
    src = (meta.get("state") or {}).get("hf") or {}
    dtype = dtype or src.get("dtype") or "float32"
    master = ckpt.DTYPES[meta["dtype"]]
    tensors = {i.name: ckpt.read_slice(p, "params", k, dtype=master) for k, i in enumerate(param_table(spec))}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf.write_weights(out, spec, tensors, dtype)
    (out / "config.json").write_text(json.dumps(hf.hf_config(spec, dtype, src.get("config")), indent=2) + "\n")
    tok = next((d / TOKENIZER for d in (p, p.parent) if (d / TOKENIZER).is_file()), None)
    if tok is not None:
        shutil.copyfile(tok, out / TOKENIZER)
    return {"model": spec, "checkpoint": str(p), "dtype": dtype, "tokenizer": str(tok or "")}
