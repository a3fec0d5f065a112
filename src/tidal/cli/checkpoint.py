"""`tidal checkpoint inspect DIR`: what a checkpoint holds: its step, the run's config, every tensor with its shape.

DIR is one checkpoint (``.../step-000006``) or a checkpoint directory (the checkpoint ``latest`` names is shown, or
the newest complete, verified one, as `--resume` would pick). Every file is verified against the manifest's sha256
first (`--no-verify` skips it); a damaged checkpoint exits 2 with one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from tidal.core.errors import TidalError


def add_parser(sub) -> None:
    p = sub.add_parser("checkpoint", help="inspect training checkpoints", description=__doc__)
    csub = p.add_subparsers(dest="checkpoint_command", required=True)
    i = csub.add_parser("inspect", help="step, config and tensors (with shapes) of a checkpoint", description=__doc__)
    i.add_argument("dir", type=Path, help="a checkpoint (step-NNNNNN) or a checkpoint directory")
    i.add_argument("--no-verify", action="store_true", help="do not hash the files against the manifest")
    i.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    i.set_defaults(func=run_inspect)


def describe(path: str | Path, verify: bool = True) -> dict:
    """{"path", "note", "manifest" (without its per-file hashes), "files", "tensors": [{"key", "shape", "dtype",
    "chunks"}]} of a checkpoint or of the one a checkpoint directory resumes from."""
    from tidal.runtime import checkpoint as ckpt
    from tidal.runtime import ckptdir

    p, note = Path(path), ""
    if not p.is_dir():
        raise TidalError(f"{p}: no such directory")
    if not (p / ckpt.MANIFEST).exists() and ((p / "latest").exists() or ckptdir.checkpoints(p)):
        if verify:
            res = ckptdir.resolve(p, None)
            p, note = Path(res.path), res.note
        else:
            p = Path(p / (p / "latest").read_text().strip())
    meta = ckpt.verify(p) if verify else ckpt.load_meta(p)
    tensors = []
    try:
        import torch.distributed.checkpoint as dcp

        md = dcp.FileSystemReader(str(p)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any unreadable metadata is one line
        raise TidalError(f"{p / '.metadata'}: unreadable DCP metadata ({type(e).__name__})") from None
    for k, m in sorted(md.state_dict_metadata.items()):
        if hasattr(m, "size"):
            tensors.append({"key": k, "shape": list(m.size), "dtype": str(m.properties.dtype).replace("torch.", ""),
                            "chunks": len(m.chunks)})
        else:
            tensors.append({"key": k, "shape": None, "dtype": "bytes", "chunks": 1})
    files = meta.pop("files")
    return {"path": str(p), "note": note, "verified": verify, "manifest": meta,
            "files": {n: f["bytes"] for n, f in files.items()}, "tensors": tensors}


def run_inspect(args) -> int:
    d = describe(args.dir, verify=not args.no_verify)
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    m = d["manifest"]
    if d["note"]:
        print(d["note"])
    print(f"checkpoint {d['path']}  ({m['format']}{', verified' if d['verified'] else ', NOT verified'})")
    print(f"step {m['step']}  optimizer steps {m['optimizer_steps']}  written by {m['world']} ranks  "
          f"master dtype {m['dtype']}  model {m['model'].get('name')}")
    total = sum(d["files"].values())
    print(f"files: {len(d['files'])} ({total:,} bytes): {', '.join(sorted(d['files']))}")
    cfg = m.get("config")
    if cfg:
        print("config:")
        for section, values in cfg.items():
            print(f"  [{section}] " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()))
    planner = (m.get("state") or {}).get("planner") or {}
    if planner:
        print(f"planner: step counter {planner.get('index')}, candidates {'; '.join(planner.get('candidates', []))}")
    print(f"tensors: {len(d['tensors'])}")
    width = max((len(t["key"]) for t in d["tensors"]), default=0)
    for t in d["tensors"]:
        shape = "x".join(str(s) for s in t["shape"]) if t["shape"] is not None else "-"
        print(f"  {t['key']:<{width}}  {shape:>12}  {t['dtype']:<8} {t['chunks']} chunk(s)")
    return 0
