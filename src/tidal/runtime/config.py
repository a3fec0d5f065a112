"""`tidal train` configuration: one TOML file mapped onto nested frozen dataclasses, validated before any process
group exists (torchtitan's order: parse, validate, then start ranks).

Sections and keys (all optional except where noted; see docs/training.md for the full reference)::

    [model]      name = "tiny", attn_backend = "auto", compile = "auto"|"off"|"dense"; a shape (docs/models.md): layers,
                 hidden, heads, kv_heads, ffn, vocab, rope_theta, norm_eps, tie_embeddings (all shape keys without a
                 preset name; any subset to change a preset)
    [world]      cluster = "cpux4"                  # TYPExN; N must equal the number of ranks
                 memory_gib = 0                     # per-device memory the planner plans for; 0: the type's own
    [data]       source = "stdlib", max_len, tokens_per_step, long_docs = "split", seed, tokenizer = "",
                 cache_dir = "", cycle = false
    [planner]    strategies = "auto" | "tp2+2*tp1;4*tp1", packing = "hydraulis"|"wlb"|"wlb-fixed"|"fixed",
                 cp_sharding = "adaptive", rotate = false,
                 cost_model = "" (analytic) | "analytic-eager" | a fitted model or profile,
                 exact = false, name = "tidal"|"flexpipe", flexpipe_depths = "" ("1,2,4": cycle these depths)
    [optimizer]  lr, beta1, beta2, eps, weight_decay, clip, warmup_steps, decay_steps, min_lr_ratio
    [train]      steps, seed, schedule = "1f1b"|"gpipe", master_dtype = "float32", compute_dtype = "auto",
                 metrics = "" (JSONL path), progress = true, overlap_pull = true, sequence_parallel = false,
                 refit = "off"|"online", refit_every = 5,
                 plan_ahead = 2, checkpoint_dir = "", checkpoint_every = 0, resume = false, keep_checkpoints = 3,
                 async_checkpoint = true, gc_every = 1,
                 collective_timeout_s = 600, stop_grace_s = 60, max_consecutive_skips = 3, inject_nan = "",
                 cost_model_warn = 0.2, tf32 = true,
                 tensorboard = "" (log dir), wandb = "" | "offline", wandb_project = "tidal", wandb_dir = ""

Any key can also be set on the command line as `--section.key VALUE` (`load_config(path, overrides)`: the pairs are
applied to the parsed document before validation; cli/configargs.py, decision 87).

An unknown section or key (named with the closest known one), a wrong type, or a config that cannot run (world size vs
cluster, a strategy needing more devices, a scheme that does not fit memory, TP not dividing the heads) raises
TidalError with one line.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tidal.core.errors import TidalError, did_you_mean
from tidal.core.limits import check_finite, check_lengths
from tidal.core.model import MODEL_PRESETS, ModelSpec, get_model
from tidal.core.recompute import parse_recompute
from tidal.data.sampler import LONG_DOC_POLICIES
from tidal.runtime.optim import OptimConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


MASTER_DTYPES = ("float32", "float64")
# auto: bfloat16 on CUDA (fp32 master weights), float32 on CPU, float64 when master_dtype is float64
# (runtime.executor.compute_dtype_for resolves it on each rank's device)
COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float64")


def compute_dtype_for(compute: str, master: str, device_type: str) -> str:
    """The compute dtype a setting means on a device of type `device_type` ("cuda", "cpu"): an explicit one as
    given; "auto" is float64 when the master weights are float64 (verification), else bfloat16 on CUDA (bf16
    compute, fp32 master weights and moments) and float32 elsewhere (CPUs have no fast bf16 matmul, and fp32 keeps
    CPU runs comparable to one process)."""
    if compute != "auto":
        return compute
    if master == "float64":
        return "float64"
    return "bfloat16" if device_type == "cuda" else "float32"


SHAPE_KEYS = MappingProxyType({"layers": int, "hidden": int, "heads": int, "kv_heads": int, "ffn": int, "vocab": int,
                               "rope_theta": float, "norm_eps": float, "tie_embeddings": bool})
REQUIRED_SHAPE = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")


@dataclass(frozen=True)
class ModelConfig:
    """A preset (`name` alone), a preset with some shape keys changed, or a custom Llama-family shape (`name` is not
    a preset: layers, hidden, heads, kv_heads, ffn and vocab are required; rope_theta 10000, norm_eps 1e-5, untied
    by default). None = not given."""

    name: str = "tiny"
    attn_backend: str = "auto"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None
    rope_theta: float | None = None
    norm_eps: float | None = None
    tie_embeddings: bool | None = None
    compile: str = "auto"  # "dense": RMSNorm and SwiGLU's gate compiled; auto: dense on CUDA (models/dense.py)

    key_types = SHAPE_KEYS  # class attribute (no annotation): the TOML types of the keys whose default is None

    def shape(self) -> dict:
        return {k: getattr(self, k) for k in SHAPE_KEYS if getattr(self, k) is not None}

    def spec(self) -> ModelSpec:
        """The model this section describes; TidalError with one line when it is incomplete or invalid."""
        given = self.shape()
        if self.name in MODEL_PRESETS:  # a changed preset is named by its changes (no preset's profile applies)
            if not given:
                return MODEL_PRESETS[self.name]
            label = ",".join(f"{k}={v}" for k, v in given.items())
            return dataclasses.replace(MODEL_PRESETS[self.name], name=f"{self.name}({label})", **given)
        if not given:
            return get_model(self.name)  # unknown preset: its one-line error names the presets
        missing = [k for k in REQUIRED_SHAPE if k not in given]
        if missing:
            raise TidalError(f"[model] {self.name!r} is not a preset, so its shape needs {', '.join(missing)} "
                             f"(presets: {', '.join(MODEL_PRESETS)})")
        return ModelSpec(self.name, **given)


@dataclass(frozen=True)
class WorldConfig:
    cluster: str = "cpux4"
    memory_gib: float = 0.0  # memory per device the planner and memory model plan for; 0: the device type's own

    def __post_init__(self) -> None:
        if not (math.isfinite(self.memory_gib) and self.memory_gib >= 0):
            raise TidalError(f"[world] memory_gib must be >= 0 (0: the device type's own), got {self.memory_gib}")


@dataclass(frozen=True)
class DataConfig:
    source: str = "stdlib"  # stdlib | stdlib:tests | random:synthetic:NAME | random:lengths:FILE
    max_len: int = 1024
    tokens_per_step: int = 8192
    long_docs: str = "split"
    seed: int = 0
    tokenizer: str = ""  # tokenizer.json for real corpora (jsonl:, parquet:, hf:, dir:); byte-level when empty
    cache_dir: str = ""  # where real corpora keep their token index (default: ~/.cache/tidal/corpora)
    cycle: bool = False  # start a new epoch at the end of a finite corpus instead of stopping

    def __post_init__(self) -> None:
        check_lengths(self.max_len, self.tokens_per_step, "[data]")
        if self.long_docs not in LONG_DOC_POLICIES:
            raise TidalError(f"[data] long_docs must be one of {', '.join(LONG_DOC_POLICIES)}, got {self.long_docs!r}")


PLANNERS = ("tidal", "flexpipe")


@dataclass(frozen=True)
class PlannerConfig:
    strategies: str = "auto"
    packing: str = "hydraulis"
    cp_sharding: str = "adaptive"
    rotate: bool = False
    cost_model: str = ""
    exact: bool = False  # exact MILP dispatch and packing (small steps only; slow: benchmarks/plan_overlap.py)
    name: str = "tidal"  # "tidal" (Hydraulis-style selection over `strategies`) or "flexpipe" (HBSA per step)
    flexpipe_depths: str = ""  # flexpipe only: "" = HBSA's triggers decide the depth; "1,2,4" = cycle these depths
    charges: bool = True  # charge each candidate's gradient pull/push and CP kernel imbalance (decisions 86, 98)
    refine: bool = True  # the proposal's local search on the sampled estimate (strategies "auto"; decisions 99, 101)

    def __post_init__(self) -> None:
        if self.name not in PLANNERS:
            raise TidalError(f"[planner] name must be one of {', '.join(PLANNERS)}, got {self.name!r}")
        if self.flexpipe_depths and self.name != "flexpipe":
            raise TidalError("[planner] flexpipe_depths needs name = \"flexpipe\"")


@dataclass(frozen=True)
class TrainSection:
    steps: int = 20
    seed: int = 0
    schedule: str = "1f1b"
    master_dtype: str = "float32"  # master weights and Adam moments: float32 | float64
    compute_dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU, float64 with float64 masters
    metrics: str = ""
    progress: bool = True
    overlap_pull: bool = True
    sequence_parallel: bool = False  # Megatron-style SP inside every TP group (runtime/tp.py)
    recompute: str = "none"  # none | full | selective | auto, or one per stage "full,selective,none" (decision 90)
    offload: bool = False  # saved activations to pinned host memory between forward and backward (CPU: no-op)
    refit: str = "off"  # "online": refit the cost model's coefficients from measured steps (docs/training.md)
    refit_every: int = 5  # steps between online refits
    plan_ahead: int = 2  # plans computed ahead in a background process (queue depth); 0 = plan inline
    checkpoint_dir: str = ""  # sharded checkpoints go to <dir>/step-NNNNNN, <dir>/latest names the newest
    checkpoint_every: int = 0  # save every N steps (and after the last step); 0 = only after the last step
    resume: bool = False  # continue from <checkpoint_dir>/latest: weights, moments, planner and data state
    keep_checkpoints: int = 3  # complete checkpoints kept (the newest K); 0 keeps all
    async_checkpoint: bool = True  # dcp.async_save: write the checkpoint while the next step trains
    gc_every: int = 1  # Python's cyclic GC only between steps, every N steps (runtime/gcsync.py); 0 = automatic
    # reliability (docs/training.md "Lifecycle", "Timeouts", "Non-finite steps"; decisions 80-81)
    collective_timeout_s: float = 600.0  # longest one rank may wait for another at a collective; then it is named
    stop_grace_s: float = 60.0  # after SIGTERM/SIGINT: reach a step boundary and checkpoint within this, else killed
    max_consecutive_skips: int = 3  # non-finite steps (skipped on every rank) in a row before the run stops (exit 4)
    inject_nan: str = ""  # test hook: "RANK@STEP" or "RANK@FIRST-LAST" makes that rank's gradients NaN at those steps
    # warn (one line) when the median |measured / estimated - 1| of the first measured steps exceeds this (decision 87)
    cost_model_warn: float = 0.2
    # TF32 for fp32 matmuls on CUDA ranks (the default, as PyTorch recommends for training); false: full fp32, e.g. to
    # compare an fp32 GPU run with the CPU reference at fp32 tolerances (tests/runtime/test_cuda.py). No effect on CPU.
    tf32: bool = True
    # optional metric writers on rank 0 (cli/writers.py; docs/training.md "Logging")
    tensorboard: str = ""  # TensorBoard log directory (needs the tensorboard package); empty: off
    wandb: str = ""  # "offline": a W&B run written locally, uploaded later with `wandb sync`; empty: off
    wandb_project: str = "tidal"
    wandb_dir: str = ""  # where the offline run goes (W&B's default, ./wandb, when empty)

    def __post_init__(self) -> None:
        if self.master_dtype not in MASTER_DTYPES:
            raise TidalError(f"[train] master_dtype must be one of {', '.join(MASTER_DTYPES)}, got "
                             f"{self.master_dtype!r}" + (" (bf16 master weights lose updates)"
                                                         if self.master_dtype == "bfloat16" else ""))
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise TidalError(f"[train] compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got "
                             f"{self.compute_dtype!r}")
        check_finite(self.collective_timeout_s, "[train] collective_timeout_s", low=0.0, low_open=True)
        check_finite(self.stop_grace_s, "[train] stop_grace_s", low=0.0, low_open=True)
        if self.max_consecutive_skips < 1:
            raise TidalError(f"[train] max_consecutive_skips must be >= 1, got {self.max_consecutive_skips}")
        nan_steps(self.inject_nan)  # validates the hook's syntax
        check_finite(self.cost_model_warn, "[train] cost_model_warn", low=0.0)
        try:
            if self.recompute != "auto":
                parse_recompute(self.recompute)
        except TidalError as e:
            raise TidalError(f"[train] {e}") from None


def nan_steps(spec: str) -> tuple[int, int, int] | None:
    """`[train] inject_nan` parsed: (rank, first step, last step), 1-based steps; None when empty."""
    if not spec:
        return None
    try:
        rank, steps = spec.split("@")
        first, _, last = steps.partition("-")
        out = int(rank), int(first), int(last or first)
    except ValueError:
        raise TidalError(f"[train] inject_nan must be RANK@STEP or RANK@FIRST-LAST, got {spec!r}") from None
    if out[0] < 0 or out[1] < 1 or out[2] < out[1]:
        raise TidalError(f"[train] inject_nan must be RANK@STEP or RANK@FIRST-LAST, got {spec!r}")
    return out


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    optimizer: OptimConfig = field(default_factory=OptimConfig)
    train: TrainSection = field(default_factory=TrainSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def section_classes() -> dict[str, type]:
    """The TOML sections and the dataclass each one maps onto, in file order."""
    return {f.name: f.default_factory for f in fields(TrainConfig)}


def key_type(cls, key: str) -> type:
    """The TOML type of `cls`'s field `key` (int, float, bool or str)."""
    return getattr(cls, "key_types", {}).get(key) or (type(getattr(cls(), key)) if key not in ("beta1", "beta2")
                                                     else float)


def _typed(section: str, cls, raw: Any):
    if not isinstance(raw, dict):
        raise TidalError(f"config section [{section}] must be a table")
    known = {f.name: f for f in fields(cls)}
    kw = {}
    for key, value in raw.items():
        if key not in known:
            raise TidalError(f"config [{section}]: unknown key {key!r}{did_you_mean(key, known)} (known: "
                             f"{', '.join(known)})")
        want = key_type(cls, key)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise TidalError(f"config [{section}] {key}: expected {want.__name__}, got {type(value).__name__} "
                             f"{value!r}")
        kw[key] = value
    return cls(**kw)


def config_from_dict(d: dict) -> TrainConfig:
    known = {f.name: f for f in fields(TrainConfig)}
    parts = {}
    for section, raw in d.items():
        if section not in known:
            raise TidalError(f"config: unknown section [{section}]{did_you_mean(section, known)} (known: "
                             f"{', '.join(known)})")
        parts[section] = _typed(section, known[section].default_factory, raw)
    return TrainConfig(**parts)


BOOL_WORDS = MappingProxyType({"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
                               "on": True, "off": False})


def override_value(name: str, text: str, want: type):
    """A command line's text for key `name` ("section.key") as the TOML type `want`; TidalError with one line."""
    if want is str:
        return text
    if want is bool:
        if text.strip().lower() not in BOOL_WORDS:
            raise TidalError(f"--{name}: expected true or false, got {text!r}")
        return BOOL_WORDS[text.strip().lower()]
    try:
        return want(text)
    except ValueError:
        raise TidalError(f"--{name}: expected {'an integer' if want is int else 'a number'}, got {text!r}") from None


def apply_overrides(d: dict, overrides) -> dict:
    """`d` (a parsed TOML document) with command-line overrides applied, in order: each is ("section.key", text),
    the text converted to the key's TOML type. An unknown section or key is refused with one line naming it (and the
    closest known one); values are validated afterwards, with the file's, by `config_from_dict`."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    sections = section_classes()
    for name, text in overrides:
        section, _, key = name.partition(".")
        if section not in sections:
            raise TidalError(f"--{name}: unknown section [{section}]{did_you_mean(section, sections)} (known: "
                             f"{', '.join(sections)})")
        cls = sections[section]
        known = [f.name for f in fields(cls)]
        if key not in known:
            flags = [f"{section}.{k}" for k in known]
            raise TidalError(f"--{name}: unknown key {key!r} in [{section}]{did_you_mean(name, flags, prefix='--')} "
                             f"(known: {', '.join(known)})")
        if not isinstance(out.setdefault(section, {}), dict):
            raise TidalError(f"config section [{section}] must be a table")
        out[section][key] = override_value(name, text, key_type(cls, key))
    return out


def with_overrides(cfg: TrainConfig, overrides) -> TrainConfig:
    """`cfg` with `overrides` applied the same way (a config built in code, such as `tidal verify`'s)."""
    if not overrides:
        return cfg
    d = {s: {k: v for k, v in sec.items() if v is not None} for s, sec in cfg.to_dict().items()}
    return config_from_dict(apply_overrides(d, overrides))


def load_config(path: str | Path, overrides=()) -> TrainConfig:
    """The TOML file at `path`, with `overrides` (("section.key", text) pairs, `--section.key text` on a command
    line) applied to the parsed document before anything is validated."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TidalError(f"cannot read config {p}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TidalError(f"config {p} is not a UTF-8 TOML file") from None
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TidalError(f"{p}: malformed TOML: {e}") from None
    return config_from_dict(apply_overrides(d, overrides))


def model_arg(value: str) -> ModelConfig:
    """A command line's ``--model``: a preset name, or a TOML file whose ``[model]`` section gives the shape (a
    training config or a file of that section alone)."""
    if not value.endswith(".toml"):
        return ModelConfig(value)
    p = Path(value)
    try:
        d = tomllib.loads(p.read_text())
    except OSError as e:
        raise TidalError(f"cannot read model file {p}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise TidalError(f"{p}: malformed TOML: {e}") from None
    if "model" not in d:
        raise TidalError(f"{p}: no [model] section")
    cfg = _typed("model", ModelConfig, d["model"])
    cfg.spec()  # validate now, one line
    return cfg

