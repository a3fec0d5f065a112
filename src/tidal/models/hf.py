"""Hugging Face Llama directories: config.json <-> ModelSpec, the parameter name map, and safetensors files.

No torch.distributed here (runtime/hfckpt.py turns these tensors into a Tidal checkpoint and back).

Name map (HF ``LlamaForCausalLM`` / ``MistralForCausalLM`` -> ``tidal.models.llama.Llama``)::

    model.embed_tokens.weight                       tok_embeddings.weight
    model.layers.N.input_layernorm.weight           layers.N.attention_norm.weight
    model.layers.N.self_attn.{q,k,v,o}_proj.weight  layers.N.attention.w{q,k,v,o}.weight
    model.layers.N.post_attention_layernorm.weight  layers.N.ffn_norm.weight
    model.layers.N.mlp.{gate,up,down}_proj.weight   layers.N.feed_forward.{w1,w3,w2}.weight
    model.norm.weight                               norm.weight
    lm_head.weight                                  output.weight (absent when tied)

RoPE layout: both apply rotary embeddings by rotate-half (the first and second halves of each head form the pairs,
``models.llama.apply_rope``), so q/k rows are copied as they are; no permutation (Meta's original checkpoints
interleave and need one; HF's do not).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table

MODEL_TYPES = ("llama", "mistral")  # architectures whose weights map one to one onto models/llama.py
_LAYER = {"input_layernorm": "attention_norm", "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
          "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
          "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
          "mlp.down_proj": "feed_forward.w2"}
_TOP = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def hf_to_tidal_name(name: str) -> str | None:
    """Tidal's name of HF parameter `name` (None for one Tidal has no place for)."""
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        sub = ".".join(parts[3:-1])
        if sub in _LAYER:
            return f"layers.{parts[2]}.{_LAYER[sub]}.weight"
    return None


def tidal_to_hf_name(name: str) -> str:
    for hf, ti in _TOP.items():
        if name == ti:
            return hf
    parts = name.split(".")
    sub = ".".join(parts[2:-1])
    for hf, ti in _LAYER.items():
        if ti == sub:
            return f"model.layers.{parts[1]}.{hf}.weight"
    raise TidalError(f"no Hugging Face name for parameter {name!r}")


def spec_from_hf_config(cfg: dict, name: str) -> ModelSpec:
    """The ModelSpec of an HF Llama/Mistral config.json; TidalError (one line) for what models/llama.py cannot run
    exactly: another architecture, attention/MLP biases (Qwen2), RoPE scaling, a sliding window, a head_dim other
    than hidden/heads, an activation other than SiLU."""
    mt = cfg.get("model_type")
    if mt not in MODEL_TYPES:
        why = " (Qwen2 has q/k/v biases, which Tidal's Llama has not; the qwen2.5-7b preset is shape only)" \
            if mt == "qwen2" else ""
        raise TidalError(f"config.json: model_type {mt!r} is not supported; import reads {', '.join(MODEL_TYPES)}"
                         f"{why}")
    for k in ("attention_bias", "mlp_bias"):
        if cfg.get(k):
            raise TidalError(f"config.json: {k} = true; Tidal's Llama has no biases")
    if cfg.get("rope_scaling"):
        raise TidalError(f"config.json: rope_scaling {cfg['rope_scaling']!r} is not supported (plain RoPE only)")
    rp = cfg.get("rope_parameters")  # transformers >= 5 keeps rope_theta here
    if isinstance(rp, dict) and rp.get("rope_type", "default") != "default":
        raise TidalError(f"config.json: rope_type {rp.get('rope_type')!r} is not supported (plain RoPE only)")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        raise TidalError(f"config.json: sliding_window {cfg['sliding_window']} is not supported (full attention)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise TidalError(f"config.json: hidden_act {cfg['hidden_act']!r}; Tidal's MLP is SwiGLU (silu)")
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        theta = cfg.get("rope_theta", (rp or {}).get("rope_theta", 10000.0))
        spec = ModelSpec(name, layers=int(cfg["num_hidden_layers"]), hidden=hidden, heads=heads,
                         kv_heads=int(cfg.get("num_key_value_heads") or heads), ffn=int(cfg["intermediate_size"]),
                         vocab=int(cfg["vocab_size"]), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                         rope_theta=float(theta), norm_eps=float(cfg.get("rms_norm_eps", 1e-6)))
    except KeyError as e:
        raise TidalError(f"config.json: missing {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise TidalError(f"config.json: malformed value ({e})") from None
    if cfg.get("head_dim") not in (None, spec.head_dim):
        raise TidalError(f"config.json: head_dim {cfg['head_dim']} differs from hidden/heads = {spec.head_dim}")
    return spec


def hf_config(spec: ModelSpec, dtype: str = "float32", extra: dict | None = None) -> dict:
    """A LlamaForCausalLM config.json for `spec` (`extra`: keys of an imported config carried over, e.g. token ids)."""
    cfg = dict(extra or {})
    cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": spec.hidden,
                "intermediate_size": spec.ffn, "num_hidden_layers": spec.layers,
                "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads,
                "head_dim": spec.head_dim, "vocab_size": spec.vocab, "rms_norm_eps": spec.norm_eps,
                "rope_theta": spec.rope_theta, "tie_word_embeddings": spec.tie_embeddings, "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
                # rope_theta for transformers 4, rope_parameters for 5
                "rope_parameters": {"rope_theta": spec.rope_theta, "rope_type": "default"}})
    for k in ("sliding_window", "use_sliding_window", "rope_scaling", "dtype"):
        cfg.pop(k, None)
    return cfg


def read_config(directory: str | Path) -> dict:
    f = Path(directory) / "config.json"
    try:
        cfg = json.loads(f.read_text())
    except FileNotFoundError:
        raise TidalError(f"{directory}: no config.json (not a Hugging Face model directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TidalError(f"{f}: unreadable ({type(e).__name__})") from None
    if not isinstance(cfg, dict):
        raise TidalError(f"{f}: not a JSON object")
    return cfg


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError:
        raise TidalError("Hugging Face import/export needs safetensors: pip install 'tidal[hf]'") from None
    return st


def read_weights(directory: str | Path, spec: ModelSpec) -> tuple[dict[str, torch.Tensor], str]:
    """Every parameter of `spec` by Tidal name, as stored (HF dtype), from the directory's ``*.safetensors``; and
    the stored dtype's name. TidalError for a missing, unknown or misshapen tensor."""
    st = _safetensors()
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise TidalError(f"{directory}: no *.safetensors files (pytorch_model.bin is not read; re-save with "
                         f"safe_serialization=True)")
    got: dict[str, torch.Tensor] = {}
    lm_head = None
    for f in files:
        try:
            tensors = st.load_file(str(f))
        except Exception as e:  # safetensors raises its own error types
            raise TidalError(f"{f}: unreadable safetensors file ({type(e).__name__})") from None
        for hf_name, t in tensors.items():
            name = hf_to_tidal_name(hf_name)
            if name is None:
                if hf_name.endswith("rotary_emb.inv_freq"):
                    continue  # a buffer older transformers saved; recomputed from rope_theta
                raise TidalError(f"{f.name}: tensor {hf_name!r} has no place in Tidal's Llama")
            if name == "output.weight" and spec.tie_embeddings:
                lm_head = t
                continue
            got[name] = t
    out, dtypes = {}, set()
    for info in param_table(spec):
        t = got.pop(info.name, None)
        if t is None:
            raise TidalError(f"{directory}: no tensor for {tidal_to_hf_name(info.name)} ({info.name})")
        if tuple(t.shape) != info.shape:
            raise TidalError(f"{directory}: {tidal_to_hf_name(info.name)} has shape {tuple(t.shape)}, config.json "
                             f"implies {info.shape}")
        out[info.name] = t
        dtypes.add(t.dtype)
    if got:
        raise TidalError(f"{directory}: tensor {tidal_to_hf_name(next(iter(got)))} is beyond config.json's shape")
    if lm_head is not None and not torch.equal(lm_head, out["tok_embeddings.weight"]):
        raise TidalError(f"{directory}: tie_word_embeddings is true but lm_head.weight differs from embed_tokens")
    if len(dtypes) != 1:
        raise TidalError(f"{directory}: tensors of several dtypes {sorted(map(str, dtypes))}")
    dtype = str(dtypes.pop()).replace("torch.", "")
    if dtype not in DTYPES:
        raise TidalError(f"{directory}: tensors of dtype {dtype}; import reads {', '.join(DTYPES)}")
    return out, dtype


def write_weights(directory: str | Path, spec: ModelSpec, tensors: dict[str, torch.Tensor], dtype: str) -> Path:
    """``model.safetensors`` with HF names (no lm_head when tied), each tensor cast to `dtype`."""
    st = _safetensors()
    if dtype not in DTYPES:
        raise TidalError(f"export dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    out = {tidal_to_hf_name(i.name): tensors[i.name].to(DTYPES[dtype]).contiguous() for i in param_table(spec)}
    f = Path(directory) / "model.safetensors"
    st.save_file(out, str(f), metadata={"format": "pt"})
    return f
