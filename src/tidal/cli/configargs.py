"""`--section.key VALUE` for every key of the training TOML (torchtitan's style), one config system.

Every flag appends ``("section.key", text)`` to ``args.overrides`` in command-line order; the older flags of `tidal
train` (`--steps`, `--metrics`, `--refit`, `--cost-model`, `--checkpoint-dir`, `--checkpoint-every`, `--resume`,
`--collective-timeout`) are aliases that append the same pair. `runtime.config.load_config` (or `with_overrides`)
applies the pairs to the parsed TOML document before anything is validated, so an override gets the file's own
one-line errors (an unknown key named with the closest known one, a wrong type, a value out of range).
"""

from __future__ import annotations

import argparse
from dataclasses import fields

# one line per key: what it does (the default is added from the dataclass); docs/training.md has the full reference
KEY_HELP = {
    "model.name": "preset name (tiny, small, llama2-7b, llama3-8b, qwen2.5-7b, mistral-7b, ...) or a custom shape's",
    "model.attn_backend": "attention kernel: auto, mixed, flash, flex, sdpa, reference",
    "model.layers": "transformer layers (a custom shape, or a change to the preset)",
    "model.hidden": "hidden size",
    "model.heads": "attention heads",
    "model.kv_heads": "key/value heads (GQA)",
    "model.ffn": "feed-forward (SwiGLU) size",
    "model.vocab": "vocabulary size",
    "model.rope_theta": "RoPE base θ (10000 when not a preset)",
    "model.norm_eps": "RMSNorm epsilon (1e-5 when not a preset)",
    "model.tie_embeddings": "tie the output projection to the embedding",
    "model.compile": "dense: torch.compile each layer's RMSNorm and SwiGLU gate (models/dense.py); off; auto: dense "
                     "on CUDA",
    "world.cluster": "cluster TYPExN[+TYPExM] (cpux4, a800x64, h800x16+h20x32); N must equal the ranks",
    "world.memory_gib": "memory per device the planner plans for, in GiB (0: the device type's own; not enforced)",
    "data.source": "corpus: stdlib, stdlib:defs, random:synthetic:NAME, random:lengths:FILE, jsonl:PATH, "
                   "parquet:PATH, hf:PATH, dir:PATH (docs/data.md)",
    "data.max_len": "context length: the longest sequence in a step",
    "data.tokens_per_step": "tokens per step (global batch)",
    "data.long_docs": "documents longer than max_len: split, truncate or error",
    "data.seed": "data order seed",
    "data.tokenizer": "tokenizer.json for real corpora (bytes when empty)",
    "data.cache_dir": "where real corpora keep their token index (~/.cache/tidal/corpora when empty)",
    "data.cycle": "start a new epoch at the end of a finite corpus instead of stopping",
    "planner.strategies": "'auto' (proposed from the data) or strategies separated by ';', e.g. 'tp2+2*tp1;4*tp1'",
    "planner.packing": "micro-batch packing: hydraulis, wlb, wlb-fixed, fixed",
    "planner.cp_sharding": "CP sharding of documents: adaptive, per-seq, per-doc",
    "planner.rotate": "run step k on candidate k mod S (tests every candidate) instead of the planner's choice",
    "planner.cost_model": "fitted cost model JSON or profile CSV from `tidal profile` (analytic when empty)",
    "planner.exact": "exact MILP dispatch and packing (small steps only; slow)",
    "planner.name": "'tidal' (selection over the candidate strategies) or 'flexpipe' (HBSA picks depth and split)",
    "planner.flexpipe_depths": "flexpipe only: pipeline depths cycled step by step, e.g. '1,2,4'; empty: HBSA decides",
    "planner.charges": "charge each candidate's gradient pull/push and CP kernel imbalance in the proposal and the "
                       "selection, as `tidal simulate` executes them (false: the ablation)",
    "planner.refine": "strategies 'auto': refine the proposal by a local search on its sampled estimate, as the "
                      "simulator's tidal system does (false: the plain proposal, 2.5-4x faster to propose)",
    "optimizer.lr": "peak learning rate",
    "optimizer.beta1": "AdamW β1",
    "optimizer.beta2": "AdamW β2",
    "optimizer.eps": "AdamW ε",
    "optimizer.weight_decay": "decoupled weight decay (matrices only)",
    "optimizer.clip": "max global gradient norm; 0 disables clipping",
    "optimizer.warmup_steps": "linear warm-up steps",
    "optimizer.decay_steps": "cosine decay steps after the warm-up",
    "optimizer.min_lr_ratio": "final learning rate as a fraction of lr",
    "train.steps": "training steps",
    "train.seed": "initialisation seed",
    "train.schedule": "pipeline schedule: 1f1b or gpipe",
    "train.master_dtype": "master weights and Adam moments: float32 or float64",
    "train.compute_dtype": "auto (bfloat16 on CUDA, float32 on CPU, float64 with float64 masters), float32, "
                           "bfloat16, float64",
    "train.metrics": "JSONL file, one row per step (docs/training.md lists the fields)",
    "train.progress": "progress bar on a terminal, one line per step otherwise",
    "train.overlap_pull": "overlap the parameter pull with compute",
    "train.sequence_parallel": "Megatron-style sequence parallelism inside every TP group",
    "train.refit": "off, or online: refit the cost model from measured steps",
    "train.refit_every": "steps between online refits",
    "train.plan_ahead": "plans computed ahead in a background process; 0 plans inline",
    "train.checkpoint_dir": "sharded checkpoints go to DIR/step-NNNNNN, DIR/latest names the newest",
    "train.checkpoint_every": "save every N steps (and after the last); 0: only after the last",
    "train.resume": "continue from checkpoint_dir/latest (weights, moments, planner and data state)",
    "train.keep_checkpoints": "complete checkpoints kept (the newest K); 0 keeps all",
    "train.async_checkpoint": "write checkpoints while the next step trains",
    "train.gc_every": "Python's cyclic GC only between steps, every N steps; 0: automatic",
    "train.collective_timeout_s": "longest a rank may wait for another at a collective before it is named (exit 5)",
    "train.stop_grace_s": "after SIGTERM/SIGINT: seconds to reach a step boundary and checkpoint",
    "train.max_consecutive_skips": "non-finite steps in a row before the run stops (exit 4)",
    "train.inject_nan": "test hook: RANK@STEP or RANK@FIRST-LAST makes that rank's gradients NaN",
    "train.cost_model_warn": "warn when measured step compute time differs from the plan's estimate by more than "
                             "this fraction (median of the first measured steps); 0 disables",
    "train.recompute": "activation recomputation: none, full, selective, one per stage ('full,selective'), or auto",
    "train.offload": "saved activations to pinned host memory between forward and backward (no-op on CPU)",
    "train.tf32": "TF32 for fp32 matmuls on CUDA ranks; false: full fp32 (no effect on CPU)",
    "train.tensorboard": "TensorBoard log directory for per-step scalars (needs the tensorboard package); empty: off",
    "train.wandb": "'offline': a W&B run written locally (upload later with `wandb sync`); empty: off",
    "train.wandb_project": "W&B project name of the offline run",
    "train.wandb_dir": "directory of the offline W&B run (W&B's default, ./wandb, when empty)",
}

ALIASES = {  # `tidal train`'s older flags: each is `--section.key` under another name
    "--steps": "train.steps", "--metrics": "train.metrics", "--refit": "train.refit",
    "--cost-model": "planner.cost_model", "--checkpoint-dir": "train.checkpoint_dir",
    "--checkpoint-every": "train.checkpoint_every", "--resume": "train.resume",
    "--collective-timeout": "train.collective_timeout_s",
}


class Override(argparse.Action):
    """Appends ("section.key", text) to `namespace.overrides`; a flag given alone (nargs '?') means 'true'."""

    def __init__(self, option_strings, dest, key: str = "", **kw):
        self.key = key
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        have = list(getattr(namespace, "overrides", None) or [])
        have.append((self.key, "true" if values is None or values == [] else str(values)))
        namespace.overrides = have


def add_override_args(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    """A `--section.key VALUE` flag for every key, grouped by section. `defaults`: name the TOML default in the help
    (False where the command builds its own base config, as `tidal verify`)."""
    from tidal.runtime.config import key_type, section_classes

    p.set_defaults(overrides=None)
    for section, cls in section_classes().items():
        g = p.add_argument_group(f"[{section}] overrides", "any key of the TOML section, as --SECTION.KEY VALUE")
        base = cls()
        for f in fields(cls):
            name = f"{section}.{f.name}"
            want = key_type(cls, f.name)
            default = getattr(base, f.name)
            tail = f" (TOML default: {default!r})" if defaults and default is not None else ""
            g.add_argument(f"--{name}", action=Override, key=name, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                           metavar=want.__name__.upper(), nargs="?" if want is bool else None,
                           help=KEY_HELP[name] + tail)


def add_alias(p, flag: str, help: str, **kw) -> None:
    """One of `tidal train`'s older flags, an alias of `--section.key`."""
    key = ALIASES[flag]
    p.add_argument(flag, action=Override, key=key, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                   help=f"{help} (alias of --{key})", **kw)


def overrides_of(args) -> list[tuple[str, str]]:
    return list(getattr(args, "overrides", None) or [])
