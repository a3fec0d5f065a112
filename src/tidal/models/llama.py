"""A plain Llama-style decoder built from a ModelSpec. Never imports torch.distributed.

RMSNorm, rotary embeddings whose positions restart at every document (``VarlenBatch.positions``), SwiGLU MLP,
grouped-query attention through :func:`tidal.models.attention.varlen_attention`, tied or untied embeddings.

Tokens are a flat packed ``[T]`` sequence (no batch dimension); :class:`VarlenBatch` carries what attention needs.
The runtime parallelises a model by swapping or deleting modules (``tidal.runtime.tp`` / ``cp`` / ``pp``):

* heads per rank are read from the projection output sizes, so column-sharded ``wq/wk/wv`` just work;
* ``Attention.kv_exchange`` (default ``None``) is a hook ``(k, v, batch) -> (k_all, v_all)`` the CP runtime sets to
  all-gather keys/values across its group;
* ``Attention``/``FeedForward`` compute q/k/v and gate/up with one GEMM (``fused``) over ONE fused storage:
  ``wq/wk/wv`` (and ``w1/w3``) are named parameters that are adjacent row blocks of one tensor (:func:`fuse_storage`,
  redone whenever the module is moved or cast), so the GEMM reads them without a copy and the backward writes one
  fused weight gradient whose row blocks are the named gradients; names and shards do not depend on fusion. The
  GEMM runs between two hooks ``tp_in``/``tp_out``
  ``(x, tokens) -> x`` where TP puts its communication: one collective in and one out per sublayer (Megatron's
  f and g, or their sequence-parallel all-gather / reduce-scatter); ``Llama.seq_parallel`` says how many rows of
  the residual stream a rank keeps under sequence parallelism and gathers them before the output head;
* ``layers`` is a ``ModuleDict`` keyed by the *global* layer index, so a pipeline stage that deletes the other layers
  keeps the parameter names of the full model; ``tok_embeddings``, ``norm`` and ``output`` may be ``None`` on stages
  that do not own them.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tidal.core.attnrule import H200_RULE, AttnBackendRule
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, param_table
from tidal.models.attention import AttentionKernels, VarlenMeta, varlen_attention
from tidal.models.dense import EAGER, DenseKernels, upcast
from tidal.models.init import init_slice
from tidal.models.recompute import OffloadHooks, layer_modes, recomputed


@dataclass(frozen=True, eq=False)
class VarlenBatch:
    """Per-micro-batch attention context for the tokens this rank holds, on the device the model runs on (the model
    refuses a batch on another device: move it once per micro-batch with :meth:`to` or :func:`batch_to_device`)."""

    positions: torch.Tensor  # int64 [T]: position of each token within its document
    meta: VarlenMeta
    kv_index: torch.Tensor | None = None  # CP only: packed-order index into the all-gathered K/V buffer
    kv_rows: int = 0  # CP only: rows each rank contributes to that buffer (the largest rank's token count)

    @staticmethod
    def from_lengths(lengths, device: torch.device | str = "cpu") -> VarlenBatch:
        """A whole packed micro-batch of documents `lengths` on one rank, built on the host and moved to `device`."""
        lens = [int(x) for x in lengths]
        if not lens or min(lens) < 1:
            raise TidalError(f"document lengths must be a non-empty list of positive ints, got {lens[:8]}")
        positions = torch.cat([torch.arange(n, dtype=torch.int64, device="cpu") for n in lens])
        batch = VarlenBatch(positions, VarlenMeta.from_lengths(lens))
        return batch if torch.device(device).type == "cpu" else batch.to(device)

    @property
    def device(self) -> torch.device:
        return self.positions.device

    def to(self, device: torch.device | str) -> VarlenBatch:
        return batch_to_device(self, device)[0]


def batch_to_device(batch: VarlenBatch, device: torch.device | str,
                    *extra: torch.Tensor) -> tuple[VarlenBatch, tuple[torch.Tensor, ...]]:
    """Move `batch` and the int64 host tensors `extra` (token ids, labels) to `device` in ONE host-to-device copy:
    everything is packed into one int64 buffer, pinned on CUDA, copied with non_blocking=True, and split into views
    there. The host lists of ``batch.meta`` travel as they are, so nothing is read back from the device."""
    device = torch.device(device)
    m = batch.meta
    def there(t: torch.Tensor) -> bool:  # "cuda" (no index) matches any CUDA device
        return t.device.type == device.type and (device.index is None or t.device.index == device.index)

    if there(batch.positions) and all(there(t) for t in extra):
        return batch, tuple(extra)
    parts = [batch.positions, m.cu_seqlens_q.to(torch.int64), m.k_start, m.k_len, *extra]
    if batch.kv_index is not None:
        parts.append(batch.kv_index)
    for t in parts:
        if t.device.type != "cpu" or t.dtype != torch.int64 or t.dim() != 1:
            raise TidalError(f"batch_to_device moves 1-D int64 host tensors, got {t.dtype} {tuple(t.shape)} on "
                             f"{t.device}")
    if device.type == "cpu":
        return batch, tuple(extra)
    flat = torch.cat(parts)
    if device.type == "cuda":
        flat = flat.pin_memory()
    moved = flat.to(device, non_blocking=True).split([t.numel() for t in parts])
    pos, cu, ks, kl = moved[:4]
    ext = moved[4 : 4 + len(extra)]
    meta = VarlenMeta(cu.to(m.cu_seqlens_q.dtype), ks, kl, m.max_seqlen_q, m.max_seqlen_k, host=m.host)
    kv = moved[-1] if batch.kv_index is not None else None
    return VarlenBatch(pos, meta, kv_index=kv, kv_rows=batch.kv_rows), tuple(ext)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.dense = EAGER  # the model's DenseKernels (models/dense.py; Llama.set_compile)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense.rmsnorm(x, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin ``[T, head_dim/2]`` for the given per-token positions."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``x [T, H, D]``."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _fused_view(weights) -> torch.Tensor | None:
    """The [sum rows, cols] tensor the 2-D `weights` are row blocks of, without a copy, when they are adjacent
    contiguous blocks of one storage in order (None otherwise)."""
    w0 = weights[0]
    if w0.is_meta or not all(w.is_contiguous() and w.dim() == 2 for w in weights):
        return None
    off = w0.storage_offset()
    ptr = w0.untyped_storage().data_ptr()
    for w in weights:
        if (w.untyped_storage().data_ptr() != ptr or w.storage_offset() != off or w.dtype != w0.dtype
                or w.shape[1] != w0.shape[1]):
            return None
        off += w.numel()
    rows = sum(w.shape[0] for w in weights)
    return w0.as_strided((rows, w0.shape[1]), (w0.shape[1], 1), w0.storage_offset())


class _FusedLinear(torch.autograd.Function):
    """y = x @ [W_0; ...; W_n]^T as one GEMM over the blocks' fused storage (no copy when they are adjacent, see
    :func:`fuse_storage`; a concatenation otherwise). Saves x and the fused view; the backward computes ONE fused
    weight gradient and hands each parameter its row block (views of it)."""

    @staticmethod
    def forward(ctx, x, *weights):
        w = _fused_view(weights)
        if w is None:
            w = torch.cat(weights)
        ctx.save_for_backward(x, w)
        ctx.rows = [t.shape[0] for t in weights]
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return (gx, *gw.split(ctx.rows))


def fused_linear(x: torch.Tensor, weights) -> torch.Tensor:
    """One GEMM of `x` with the row-stacked `weights` (see :class:`_FusedLinear`)."""
    return _FusedLinear.apply(x, *weights)


def fuse_storage(params, out: torch.Tensor | None = None) -> None:
    """Make `params` (2-D, equal columns) adjacent row blocks of one tensor, keeping each Parameter object and its
    value: into `out` (a 1-D tensor of at least their total numel) or a new one. Meta tensors are left alone."""
    params = list(params)
    if not params or params[0].is_meta:
        return
    n = sum(p.numel() for p in params)
    if out is None:
        out = torch.empty(n, dtype=params[0].dtype, device=params[0].device)
    off = 0
    with torch.no_grad():
        for p in params:
            view = out[off:off + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            off += p.numel()


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, backend: str) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.backend = backend
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=False)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)
        self.fused = True  # q, k and v in one GEMM over the concatenated weights (False: three calls of wq/wk/wv)
        self.kv_exchange = None  # set by the CP runtime; (k, v, batch) -> (k_all, v_all)
        self.kernels: AttentionKernels | None = None  # compiled kernels shared by the model's layers (Llama sets it)
        self.tp_in = None  # set by the TP runtime; (x, tokens) -> x entering the TP region (copy or seq all-gather)
        self.tp_out = None  # (y, tokens) -> y leaving it (all-reduce or seq reduce-scatter)
        self.recompute_core = False  # selective recomputation: the attention core runs again in the backward

    def forward(self, x: torch.Tensor, batch: VarlenBatch, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, hd = batch.positions.shape[0], self.head_dim
        if self.tp_in is not None:
            x = self.tp_in(x, n)
        # head counts from the (possibly TP-sharded) projection sizes; explicit so that 0-token CP ranks work too
        sizes = (self.wq.weight.shape[0], self.wk.weight.shape[0], self.wv.weight.shape[0])
        if self.fused:
            q, k, v = fused_linear(x, self.fused_params()).split(sizes, dim=-1)
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q = apply_rope(q.reshape(n, sizes[0] // hd, hd), cos, sin)
        k = apply_rope(k.reshape(n, sizes[1] // hd, hd), cos, sin)
        v = v.reshape(n, sizes[2] // hd, hd)
        if self.kv_exchange is not None:
            k, v = self.kv_exchange(k, v, batch)
        if self.recompute_core:  # q, k, v and the output stay (the linear layers' activations); the core reruns
            o = recomputed(varlen_attention, q, k, v, batch.meta, backend=self.backend, kernels=self.kernels)
        else:
            o = varlen_attention(q, k, v, batch.meta, backend=self.backend, kernels=self.kernels)
        out = self.wo(o.reshape(n, q.shape[1] * hd))
        return out if self.tp_out is None else self.tp_out(out, n)

    def fused_params(self) -> list[nn.Parameter]:
        """The parameters of the fused q/k/v GEMM, in storage order."""
        return [self.wq.weight, self.wk.weight, self.wv.weight]

    def _apply(self, fn, recurse=True):  # moving or casting reallocates each parameter: fuse them again
        out = super()._apply(fn, recurse)
        fuse_storage(self.fused_params())
        return out


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, spec.ffn, bias=False)  # gate
        self.w3 = nn.Linear(spec.hidden, spec.ffn, bias=False)  # up
        self.w2 = nn.Linear(spec.ffn, spec.hidden, bias=False)  # down
        self.fused = True  # gate and up in one GEMM (False: two calls)
        self.tp_in = None  # as Attention.tp_in / tp_out
        self.tp_out = None
        self.dense = EAGER  # as RMSNorm.dense

    def forward(self, x: torch.Tensor, tokens: int | None = None) -> torch.Tensor:
        n = x.shape[0] if tokens is None else int(tokens)
        if self.tp_in is not None:
            x = self.tp_in(x, n)
        if self.fused:
            gate, up = fused_linear(x, self.fused_params()).chunk(2, dim=-1)
        else:
            gate, up = self.w1(x), self.w3(x)
        out = self.w2(self.dense.swiglu(gate, up))
        return out if self.tp_out is None else self.tp_out(out, n)

    def fused_params(self) -> list[nn.Parameter]:
        """The parameters of the fused gate/up GEMM, in storage order."""
        return [self.w1.weight, self.w3.weight]

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        fuse_storage(self.fused_params())
        return out


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, backend: str) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden, spec.norm_eps)
        self.attention = Attention(spec, backend)
        self.ffn_norm = RMSNorm(spec.hidden, spec.norm_eps)
        self.feed_forward = FeedForward(spec)
        self.recompute = "none"  # "none" | "full" | "selective" (models/recompute.py; set by Llama.set_recompute)
        self.offload: OffloadHooks | None = None  # saved activations to host memory between forward and backward

    def forward(self, x, batch, cos, sin):
        h = x + self.attention(self.attention_norm(x), batch, cos, sin)
        return h + self.feed_forward(self.ffn_norm(h), batch.positions.shape[0])


class Llama(nn.Module):
    """The full decoder (or, after the PP runtime deletes modules, one stage of it).

    ``forward(x, batch)`` takes token ids ``[T]`` when ``tok_embeddings`` is present, else hidden states
    ``[T, hidden]``; it returns logits ``[T, vocab]`` when ``output`` is present, else hidden states.
    """

    def __init__(self, spec: ModelSpec, attn_backend: str = "auto", init_std: float = 0.02,
                 seed: int | None = None, attn_rule: AttnBackendRule = H200_RULE) -> None:
        super().__init__()
        self.spec = spec
        # the initialisation seed: given, or the first draw of torch's global generator (so that
        # `torch.manual_seed(s); Llama(spec)` equals `Llama(spec, seed=models.init.derive_seed(s))`)
        self.init_seed = (int(torch.randint(0, 2**31 - 1, (1,), device="cpu").item()) if seed is None
                          else int(seed))
        self.tok_embeddings: nn.Module | None = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec, attn_backend) for i in range(spec.layers)})
        self.norm: nn.Module | None = RMSNorm(spec.hidden, spec.norm_eps)
        self.output: nn.Module | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        # set by the TP runtime under sequence parallelism: `.rows(tokens)` rows of the residual stream live on this
        # rank between layers, and `.gather(h, tokens)` rebuilds the whole sequence before the output head
        self.seq_parallel = None
        # one compiled FlexAttention per model, not per layer or call; "mixed"'s rule and what it picked
        kernels = self.attn_kernels = AttentionKernels(attn_rule)
        for layer in self.layers.values():
            layer.attention.kernels = kernels
        self.dense = EAGER  # set_compile
        self._init(init_std)
        if spec.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        for layer in self.layers.values():  # the fused GEMMs read q/k/v and gate/up from one storage each
            fuse_storage(layer.attention.fused_params())
            fuse_storage(layer.feed_forward.fused_params())

    def _init(self, std: float) -> None:
        """Row-block seeded initialisation (models/init.py), so any shard can be initialised alone; nothing to do
        on the meta device (the runtime initialises each stage's shards after materialising them)."""
        if self.tok_embeddings.weight.is_meta:
            return
        seed = self.init_seed
        named = dict(self.named_parameters())
        with torch.no_grad():
            for i, info in enumerate(param_table(self.spec)):
                p = named[info.name]
                p.copy_(init_slice(info, i, seed, dtype=p.dtype, std=std))

    def set_attn_backend(self, backend: str) -> None:
        for layer in self.layers.values():
            layer.attention.backend = backend

    @property
    def attn_picks(self) -> dict[str, int]:
        """Under "mixed" (or "auto" resolved to it): backend -> micro-batches it ran, counted once per micro-batch."""
        return dict(self.attn_kernels.picks)

    @property
    def compile_mode(self) -> str:
        """"off" (eager) or "dense" (RMSNorm and SwiGLU's gate compiled; models/dense.py)."""
        return self.dense.mode

    def set_compile(self, mode: str, backend: str = "inductor") -> None:
        """Compile the layers' elementwise parts ("dense") or run them eagerly ("off"); decision 140. ("auto" is the
        runtime's to resolve for its device: `models.dense.resolve_compile`.)"""
        if mode not in ("off", "dense"):
            raise TidalError(f"unknown compile mode {mode!r}; choose off or dense")
        if mode != self.dense.mode:
            self.dense = DenseKernels.compiled(backend) if mode == "dense" else EAGER
        for m in self.modules():
            if isinstance(m, (RMSNorm, FeedForward)):
                m.dense = self.dense

    def set_fused(self, fused: bool) -> None:
        """One GEMM for q/k/v and one for gate/up (default), or separate projections."""
        for layer in self.layers.values():
            layer.attention.fused = layer.feed_forward.fused = bool(fused)

    def set_recompute(self, modes=None, offload=()) -> None:
        """Activation recomputation per layer (models/recompute.py): one mode ("none", "full", "selective") for every
        layer or a mapping global layer index -> mode (omitted layers: "none"); `offload`: the global layer indices
        whose saved activations go to host memory between forward and backward."""
        modes = layer_modes(modes, self.layers.keys())
        offload = {int(i) for i in offload}
        if not offload <= set(modes):
            raise TidalError(f"offload names layers {sorted(offload - set(modes))} this model does not hold")
        for key, layer in self.layers.items():
            layer.recompute = modes[int(key)]
            layer.attention.recompute_core = layer.recompute == "selective"
            layer.offload = OffloadHooks() if int(key) in offload else None

    def recompute_modes(self) -> dict[int, str]:
        """Global layer index -> the recomputation mode it runs with."""
        return {int(k): layer.recompute for k, layer in self.layers.items()}

    def forward(self, x: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
        if self.tok_embeddings is not None:
            if x.dim() != 1:
                raise TidalError(f"the first stage takes token ids [T], got shape {tuple(x.shape)}")
            h = self.tok_embeddings(x)
        else:
            h = x
        n = batch.positions.shape[0]
        rows = n if self.seq_parallel is None else self.seq_parallel.rows(n)
        if h.shape[0] != rows:
            raise TidalError(f"{h.shape[0]} rows of hidden states for {n} tokens; expected {rows}")
        if batch.positions.device != h.device:
            raise TidalError(f"the batch is on {batch.positions.device} but the model runs on {h.device}: move it "
                             f"once per micro-batch with VarlenBatch.to(device)")
        cos, sin = rope_cos_sin(batch.positions, self.spec.head_dim, self.spec.rope_theta, h.dtype)
        for layer in self.layers.values():
            with layer.offload if layer.offload is not None else nullcontext():
                # full: only the layer's input is kept; the module is called again in the backward (its forward
                # pre-hooks fire again: the executor's pull hooks are idempotent)
                h = recomputed(layer, h, batch, cos, sin) if layer.recompute == "full" else layer(h, batch, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            if self.seq_parallel is not None:
                h = self.seq_parallel.gather(h, n)
            h = self.output(h)
        return h


def storage_blocks(model: nn.Module) -> list[list[nn.Parameter]]:
    """Every parameter of `model` once (tied ones once), in `named_parameters` order, grouped into the blocks that
    must stay adjacent in storage for a zero-copy fused GEMM (q/k/v, gate/up); the others alone. A caller that moves
    the parameters into a storage of its own (the executor's flat buffer) lays each block out contiguously."""
    fused = {}
    for m in model.modules():
        if isinstance(m, (Attention, FeedForward)):
            ps = m.fused_params()
            fused[id(ps[0])] = ps
    out, seen = [], set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        block = fused.get(id(p), [p])
        seen.update(id(q) for q in block)
        out.append(block)
    return out


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies (the runtime divides by the global token count)."""
    return F.cross_entropy(upcast(logits), labels, reduction="sum")
