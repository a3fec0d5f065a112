"""`tidal import hf DIR --out CKPT_DIR` and `tidal export hf CKPT --out DIR`: Hugging Face Llama weights in and out.

Import reads a local Hugging Face Llama (or Mistral without a sliding window) directory: config.json, *.safetensors
and tokenizer.json if present; nothing is fetched from a hub. It writes a Tidal checkpoint directory: step-000000
(master weights, zero Adam moments, step 0), ``latest``, tokenizer.json and train.toml, which `tidal train --config
CKPT_DIR/train.toml` resumes from once [world], [data] and [train] steps are set. Export writes config.json,
model.safetensors and tokenizer.json (when the checkpoint directory has one) from any Tidal checkpoint.
Needs the `hf` extra (safetensors). docs/models.md.
"""

from __future__ import annotations

from pathlib import Path


def add_parsers(sub) -> None:
    i = sub.add_parser("import", help="import a model (Hugging Face Llama directory) as a Tidal checkpoint",
                       description=__doc__)
    isub = i.add_subparsers(dest="import_command", required=True)
    h = isub.add_parser("hf", help="a local Hugging Face Llama directory -> a Tidal checkpoint directory",
                        description=__doc__)
    h.add_argument("dir", type=Path, help="HF model directory (config.json, *.safetensors, tokenizer.json)")
    h.add_argument("--out", type=Path, required=True, help="new checkpoint directory (must not exist or be empty)")
    h.add_argument("--name", default="", help="model name in Tidal (default: the directory's name)")
    h.add_argument("--master-dtype", choices=("float32", "float64"), default="float32",
                   help="dtype of the master weights and moments (default: float32)")
    h.set_defaults(func=run_import)
    e = sub.add_parser("export", help="export a Tidal checkpoint (Hugging Face Llama directory)", description=__doc__)
    esub = e.add_subparsers(dest="export_command", required=True)
    x = esub.add_parser("hf", help="a Tidal checkpoint -> a Hugging Face Llama directory", description=__doc__)
    x.add_argument("ckpt", type=Path, help="a checkpoint (step-NNNNNN) or a checkpoint directory (its latest)")
    x.add_argument("--out", type=Path, required=True, help="output directory")
    x.add_argument("--dtype", choices=("", "float32", "bfloat16", "float16", "float64"), default="",
                   help="weights' dtype (default: the imported model's, else float32)")
    x.set_defaults(func=run_export)


def run_import(args) -> int:
    from tidal.runtime.hfckpt import import_hf

    r = import_hf(args.dir, args.out, name=args.name, master_dtype=args.master_dtype)
    s = r["model"]
    print(f"imported {args.dir} ({s.layers} layers, hidden {s.hidden}, {s.heads}/{s.kv_heads} heads, ffn {s.ffn}, "
          f"vocab {s.vocab}, {'tied' if s.tie_embeddings else 'untied'}, {s.num_params() / 1e6:.1f}M parameters, "
          f"{r['dtype']}) -> {r['checkpoint']}")
    print(f"config: {r['config']}" + (f"; tokenizer: {r['tokenizer']}" if r["tokenizer"] else ""))
    return 0


def run_export(args) -> int:
    from tidal.runtime.hfckpt import export_hf

    r = export_hf(args.ckpt, args.out, dtype=args.dtype)
    print(f"exported {r['checkpoint']} ({r['model'].name}, {r['dtype']}) -> {args.out}"
          + (" with tokenizer.json" if r["tokenizer"] else ""))
    return 0
