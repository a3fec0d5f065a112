"""ModelSpec: the shape of a Llama-style decoder, with FLOP and parameter counts used by the cost model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import MappingProxyType

from tidal.core.errors import TidalError
from tidal.core.limits import check_finite


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            if getattr(self, f) < 1:
                raise TidalError(f"model {self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.hidden % self.heads:
            raise TidalError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise TidalError(f"model {self.name}: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise TidalError(f"model {self.name}: head_dim {self.head_dim} (hidden/heads) must be even for RoPE")
        check_finite(self.rope_theta, f"model {self.name}: rope_theta", low=0.0, low_open=True)
        check_finite(self.norm_eps, f"model {self.name}: norm_eps", low=0.0, low_open=True)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q,k,v,o projections, SwiGLU MLP and two RMSNorm weights."""
        attn = self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return attn + mlp + 2 * self.hidden

    def embedding_params(self) -> int:
        """Input embedding, final norm and (unless tied) the output head."""
        emb = self.vocab * self.hidden
        return emb + self.hidden + (0 if self.tie_embeddings else emb)

    def num_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params()

    def linear_flops_per_token(self) -> float:
        """Forward FLOPs per token of all GEMMs in one layer (2 FLOPs per multiply-add)."""
        return 2.0 * (self.layer_params() - 2 * self.hidden)

    def attn_flops_per_token_pair(self) -> float:
        """Forward FLOPs of QK^T and PV per (query, key) pair in one layer; a causal document of length l has
        l(l+1)/2 such pairs."""
        return 4.0 * self.hidden

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> ModelSpec:
        try:
            return ModelSpec(**d)
        except TypeError as e:
            raise TidalError(f"malformed model spec: {e}") from None


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of the Llama decoder, named as ``tidal.models.llama.Llama.named_parameters()`` names it.

    This table is the single name map shared by the model, the TP runtime and the resharding engine."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None  # dimension split over TP (0: column / vocab parallel, 1: row parallel); None: replicated
    owner: str | int  # "embed" (first stage), a layer index, or "head" (last stage)
    tied_head: bool = False  # the tied embedding table, which the last stage also uses as its output head


def param_table(spec: ModelSpec) -> tuple[ParamInfo, ...]:
    """Every parameter of the full model in ``named_parameters()`` order (a tied head appears once, as the
    embedding). Column-parallel: wq, wk, wv, w1 (gate), w3 (up), output; row-parallel: wo, w2 (down); vocab-parallel
    embedding; RMSNorm weights replicated."""
    h, q, kv, f, v = spec.hidden, spec.heads * spec.head_dim, spec.kv_dim, spec.ffn, spec.vocab
    out = [ParamInfo("tok_embeddings.weight", (v, h), 0, "embed", spec.tie_embeddings)]
    for i in range(spec.layers):
        p = f"layers.{i}."
        out += [ParamInfo(p + "attention_norm.weight", (h,), None, i),
                ParamInfo(p + "attention.wq.weight", (q, h), 0, i),
                ParamInfo(p + "attention.wk.weight", (kv, h), 0, i),
                ParamInfo(p + "attention.wv.weight", (kv, h), 0, i),
                ParamInfo(p + "attention.wo.weight", (h, q), 1, i),
                ParamInfo(p + "ffn_norm.weight", (h,), None, i),
                ParamInfo(p + "feed_forward.w1.weight", (f, h), 0, i),
                ParamInfo(p + "feed_forward.w3.weight", (f, h), 0, i),
                ParamInfo(p + "feed_forward.w2.weight", (h, f), 1, i)]
    out.append(ParamInfo("norm.weight", (h,), None, "head"))
    if not spec.tie_embeddings:
        out.append(ParamInfo("output.weight", (v, h), 0, "head"))
    return tuple(out)


# Tidal's 32B: Hydraulis (§8) trains a "LLaMA2 32B" without publishing its shape. We pick 64 layers x 6144 hidden,
# 64 heads (head_dim 96), FFN 18432: 31.8B parameters, and every power-of-two TP up to 64 divides the heads.
MODEL_PRESETS: MappingProxyType[str, ModelSpec] = MappingProxyType(
    {
        # tiny: 6 layers so PP=4 can split unevenly; 8 heads over 4 KV heads (GQA) so TP=4 divides both.
        "tiny": ModelSpec("tiny", layers=6, hidden=64, heads=8, kv_heads=4, ffn=176, vocab=256),
        # tiny-tied: the same with a tied input/output embedding (first and last stage share it under PP)
        "tiny-tied": ModelSpec("tiny-tied", layers=6, hidden=64, heads=8, kv_heads=4, ffn=176, vocab=256,
                               tie_embeddings=True),
        "small": ModelSpec("small", layers=8, hidden=256, heads=8, kv_heads=4, ffn=704, vocab=4096),
        "llama2-7b": ModelSpec("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
        "llama2-13b": ModelSpec("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
        "llama-32b": ModelSpec("llama-32b", 64, 6144, 64, 64, 18432, 32000),
        # The "32b" of Hydraulis' strategy pool (model_config H = 6656, L = 60; LLaMA-33B's shape): 64 heads of 104 so
        # that its pool's TP16 divides them; FFN 17920 as LLaMA-33B.
        "hydraulis-32b": ModelSpec("hydraulis-32b", 60, 6656, 64, 64, 17920, 32000),
        "llama3-8b": ModelSpec("llama3-8b", 32, 4096, 32, 8, 14336, 128256, rope_theta=500000.0),
        "llama3-70b": ModelSpec("llama3-70b", 80, 8192, 64, 8, 28672, 128256, rope_theta=500000.0),
        # Llama-3.2-1B's published shape (tied embeddings; its rope_scaling for long contexts is not modelled): the
        # ~1B model of the one-GPU runs (docs/runtime.md)
        "llama3.2-1b": ModelSpec("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, rope_theta=500000.0,
                                 tie_embeddings=True),
        # Published config.json shapes. Mistral-7B-v0.3 (v0.1's 32000 vocabulary and 4096 sliding window aside).
        "mistral-7b": ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32768, rope_theta=1000000.0),
        # Qwen2.5-7B: shape only (planning, simulation, training from scratch). Its q/k/v projections have biases,
        # which this model has not, so `tidal import hf` refuses Qwen2 checkpoints (decision 84).
        "qwen2.5-7b": ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, rope_theta=1000000.0, norm_eps=1e-6),
    }
)


def get_model(name: str) -> ModelSpec:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise TidalError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}") from None
