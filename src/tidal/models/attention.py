"""One varlen attention interface with several backends. Never imports torch.distributed.

Layout: ``q`` is ``[Tq, H, D]``, ``k``/``v`` are ``[Tk, Hkv, D]`` (GQA: ``H % Hkv == 0``). Queries are grouped into
segments by ``cu_seqlens_q`` (int, ``[S+1]``). Segment ``s`` with ``Lq`` queries attends to the keys
``k[k_start[s] : k_start[s] + k_len[s]]`` with causal *bottom-right* alignment (as flash-attn varlen does when
``seqlen_q != seqlen_k``): its query ``i`` sees the first ``k_len[s] - Lq + i + 1`` of them. Without context
parallelism ``k_start = cu_seqlens[:-1]`` and ``k_len = diff(cu_seqlens)``: one causal block per document
(:meth:`VarlenMeta.from_cu_seqlens`). Under CP the queries are a rank's local chunks and K/V hold every token of the
micro-batch in packed order, so key ranges of different segments may overlap.

Backends (``BACKENDS``):

* ``"flash"``: ``flash_attn_varlen_func`` (CUDA only, when the package is installed). Overlapping key ranges are
  materialised by gathering each segment's keys.
* ``"flex"``: ``torch.nn.attention.flex_attention`` with a document/causal ``mask_mod``; its block mask is built once
  per micro-batch (cached on the ``VarlenMeta``, which every layer shares) and, on CUDA, the kernel is compiled
  (``torch.compile``). PyTorch has no FlexAttention backward on CPU, so on CPU it runs only when no input requires
  grad, eagerly, and ``auto`` skips it there: eager FlexAttention materialises the whole [Tq, Tk] score matrix (40-120x
  slower than ``sdpa`` here), and compiling it on CPU took 81 s for a 1.3x faster forward (docs/decisions.md).
* ``"sdpa"``: ``scaled_dot_product_attention`` once per segment (causal kernel, or the segment's own
  bottom-right mask for CP pieces): work and memory follow the documents, not the packed micro-batch. On CUDA it
  never runs cuDNN's kernel (:data:`SDPA_CUDA_KERNELS`, decision 133), which builds a graph per new shape.
* ``"reference"``: pure torch, one segment at a time, explicit softmax; the ground truth the others are tested against.
* ``"mixed"``: ``sdpa`` or ``flex`` chosen once per micro-batch from its segment lengths by an
  :class:`~tidal.core.attnrule.AttnBackendRule` (decision 119: per-document sdpa is the faster kernel per FLOP,
  one flex call wins on many short documents). The pick is made on the host from ``VarlenMeta.host`` on the first
  layer, cached on the VarlenMeta like the block mask, and counted in the model's :class:`AttentionKernels`
  (``picks``: backend -> micro-batches). A flex pick where flex cannot run (CPU with gradients) runs sdpa.
* ``"auto"``: the fastest correct one for the device, as measured in training: flash, then mixed (CUDA only: its flex
  picks need the compiled kernel, heads of at least 16), then sdpa, then reference. Decision 140 measured mixed at
  1.07-1.09x flex's tokens/s in training on an H200 once sdpa left cuDNN out (decision 133 had measured 0.61x with
  cuDNN, and made auto flex until then). :func:`explain_backend` says which one runs and why the faster ones were
  passed over.

An unavailable backend falls back along its chain (``CHAINS``; auto: flash -> mixed -> sdpa -> reference, a named
one: flash -> flex -> sdpa -> reference);
:func:`resolve_backend` reports the one actually used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tidal.core.attnrule import H200_RULE, AttnBackendRule
from tidal.core.errors import TidalError

# sdpa's kernels on CUDA, in PyTorch's order, cuDNN left out: cuDNN builds an execution graph per new (Lq, Lk) shape,
# and training's documents are nearly all new lengths (decision 133: `mixed` ran 0.61x flex's tokens/s with it)
SDPA_CUDA_KERNELS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
BACKENDS = ("auto", "mixed", "flash", "flex", "sdpa", "reference")
FALLBACK = ("flash", "flex", "sdpa", "reference")
# what each request tries, in order (the first that can run here runs)
CHAINS = {"auto": ("flash", "mixed", "sdpa", "reference"), "mixed": ("mixed", "sdpa", "reference"),
          **{b: FALLBACK[FALLBACK.index(b):] for b in FALLBACK}}


@dataclass(frozen=True, eq=False)
class VarlenMeta:
    """Segment description for :func:`varlen_attention`; see the module docstring.

    The tensors live on the device attention runs on; ``host`` keeps the same three index lists as Python ints, so
    that backends slice segments and check sizes without reading device memory (no host sync per layer). Build a
    VarlenMeta on the host (CPU tensors: ``host`` is filled from them) and move it with :meth:`to`, which carries
    ``host`` along; a VarlenMeta built directly from device tensors reads them back once, here."""

    cu_seqlens_q: torch.Tensor  # int32/int64 [S+1]
    k_start: torch.Tensor  # int64 [S]
    k_len: torch.Tensor  # int64 [S]
    max_seqlen_q: int
    max_seqlen_k: int
    # per-micro-batch artefacts that every layer reuses (FlexAttention's block mask); filled lazily by the backends
    cache: dict = field(default_factory=dict, compare=False, repr=False)
    host: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = field(default=None, compare=False,
                                                                                   repr=False)

    def __post_init__(self) -> None:
        if self.host is None:
            if any(t.is_meta for t in (self.cu_seqlens_q, self.k_start, self.k_len)):
                raise TidalError("a VarlenMeta on the meta device needs its host lists: build it on the CPU and "
                                 "move it with .to(device)")
            host = tuple(tuple(int(x) for x in t.tolist()) for t in (self.cu_seqlens_q, self.k_start, self.k_len))
            object.__setattr__(self, "host", host)

    @staticmethod
    def from_cu_seqlens(cu_seqlens: torch.Tensor, max_seqlen: int) -> VarlenMeta:
        cu = cu_seqlens.to(torch.int64)
        return VarlenMeta(cu, cu[:-1].clone(), cu[1:] - cu[:-1], int(max_seqlen), int(max_seqlen))

    @staticmethod
    def from_lengths(lengths, device: torch.device | str = "cpu") -> VarlenMeta:
        """One causal segment per document of `lengths`, built on the host and moved to `device` in one copy."""
        lens = [int(x) for x in lengths]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        flat = torch.tensor(cu + cu[:-1] + lens, dtype=torch.int64, device="cpu")
        s = len(lens)
        cu_t, ks, kl = flat.split([s + 1, s, s])
        meta = VarlenMeta(cu_t, ks, kl, max(lens, default=0), max(lens, default=0),
                          host=(tuple(cu), tuple(cu[:-1]), tuple(lens)))
        return meta if torch.device(device).type == "cpu" else meta.to(device)

    @property
    def num_segments(self) -> int:
        return len(self.host[2])

    @property
    def total_q(self) -> int:
        """Query tokens (``cu_seqlens_q[-1]``), known on the host."""
        return self.host[0][-1]

    def key_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query token, the half-open key range ``[lo, hi)`` it may attend to (int64 ``[Tq]`` each, on the
        tensors' device; computed from the host lists, then moved in one copy)."""
        cu, ks, kl = self.host
        lq = torch.tensor([cu[s + 1] - cu[s] for s in range(len(kl))], dtype=torch.int64, device="cpu")
        seg = torch.repeat_interleave(torch.arange(lq.numel(), device="cpu"), lq)
        cu0 = torch.tensor(cu[:-1], dtype=torch.int64, device="cpu")
        i = torch.arange(cu[-1], device="cpu") - cu0[seg]
        lo = torch.tensor(ks, dtype=torch.int64, device="cpu")[seg]
        hi = lo + torch.tensor(kl, dtype=torch.int64, device="cpu")[seg] - lq[seg] + i + 1
        both = torch.stack([lo, hi]).to(self.k_start.device)
        return both[0], both[1]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> VarlenMeta:
        """The same segments on `device` (a fresh cache: artefacts are per device; the host lists are kept)."""
        return VarlenMeta(*(t.to(device, non_blocking=non_blocking) for t in (self.cu_seqlens_q, self.k_start,
                                                                              self.k_len)),
                          self.max_seqlen_q, self.max_seqlen_k, host=self.host)


def _flash_fn():
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return flash_attn_varlen_func


def _flex_fn():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception:  # noqa: BLE001
        return None
    return flex_attention, create_block_mask


# FlexAttention's compiled (Inductor/Triton) kernel on CUDA refuses head dimensions below 16 ("NYI: embedding
# dimension of the query, key, and value must be at least 16", seen on an H200 with torch 2.11, docs/runtime.md)
FLEX_MIN_HEAD_DIM = 16


def _unavailable(name: str, cuda: bool, dtype: torch.dtype, needs_grad: bool, auto: bool,
                 head_dim: int | None = None) -> str:
    """Why backend `name` cannot (or, under auto, should not) run here; empty when it can. ``mixed`` named runs
    anywhere (its flex picks run sdpa where flex cannot); under auto it runs where its flex picks can."""
    if name == "mixed":  # named, it runs anywhere (a flex pick that cannot run here runs sdpa); auto asks flex's way
        why = _unavailable("flex", cuda, dtype, needs_grad, auto, head_dim) if auto else ""
        return f"its flex picks: {why}" if why else ""
    if name == "flash":
        if not cuda:
            return "needs CUDA"
        if dtype not in (torch.float16, torch.bfloat16):
            return f"needs fp16/bf16, not {str(dtype).replace('torch.', '')}"
        return "" if _flash_fn() is not None else "flash_attn is not installed"
    if name == "flex":
        if _flex_fn() is None:
            return "this PyTorch has no FlexAttention"
        if not cuda and needs_grad:
            return "no FlexAttention backward on CPU"
        if not cuda and auto:
            return "eager on CPU (materialises [Tq, Tk]; slower than sdpa)"
        if cuda and head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM:
            return f"compiled kernel needs head dim >= {FLEX_MIN_HEAD_DIM}, got {head_dim}"
    return ""


def explain_backend(name: str, device: torch.device | str, dtype: torch.dtype,
                    needs_grad: bool = True, head_dim: int | None = None) -> tuple[str, list[tuple[str, str]]]:
    """(backend that runs, [(faster backend passed over, why)]) for a request of `name` on `device` in `dtype`, for
    attention heads of `head_dim` (None: not checked). "mixed" stands for a per-micro-batch choice (see
    :func:`pick_backend` and ``AttentionKernels.picks`` for what ran)."""
    if name not in BACKENDS:
        raise TidalError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    cuda = torch.device(device).type == "cuda"
    skipped = []
    for b in CHAINS[name]:
        why = _unavailable(b, cuda, dtype, needs_grad, name == "auto", head_dim)
        if not why:
            return b, skipped
        skipped.append((b, why))
    raise AssertionError("unreachable: the reference backend is always available")


def describe_backend(name: str, device: torch.device | str, dtype: torch.dtype, needs_grad: bool = True,
                     head_dim: int | None = None) -> str:
    """One line for logs: 'sdpa (auto; flash: needs CUDA; mixed: its flex picks: no FlexAttention backward on CPU)'."""
    chosen, skipped = explain_backend(name, device, dtype, needs_grad, head_dim)
    if chosen == "mixed":
        flex_why = _unavailable("flex", torch.device(device).type == "cuda", dtype, needs_grad, False, head_dim)
        if flex_why:
            skipped = [*skipped, ("flex picks run sdpa", flex_why)]
    reasons = "; ".join(f"{b}: {why}" for b, why in skipped)
    return f"{chosen} ({name}{'; ' + reasons if reasons else ''})"


def resolve_backend(name: str, q: torch.Tensor, needs_grad: bool) -> str:
    """The backend `varlen_attention` will run for this request: `name` if usable, else the next of its chain
    ("mixed" when the choice is made per micro-batch)."""
    return explain_backend(name, q.device, q.dtype, needs_grad, q.shape[-1])[0]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: VarlenMeta,
                     backend: str = "auto", scale: float | None = None,
                     kernels: AttentionKernels | None = None) -> torch.Tensor:
    """Causal per-segment attention; returns ``[Tq, H, D]``. See the module docstring for the semantics. `kernels`
    holds compiled kernels across calls (a model passes its own; without it, a compiled backend compiles per call),
    the rule of "mixed" and the count of what it picked."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or q.shape[-1] != k.shape[-1]:
        raise TidalError(f"varlen_attention wants q [T,H,D], k/v [T,Hkv,D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise TidalError(f"query heads {q.shape[1]} are not a multiple of key/value heads {k.shape[1]}")
    if meta.total_q != q.shape[0]:
        raise TidalError(f"cu_seqlens_q ends at {meta.total_q} but q has {q.shape[0]} tokens")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    name = resolve_backend(backend, q, needs_grad)
    if name == "mixed":
        name = pick_backend(meta, q, needs_grad, kernels)
    if name == "flex":
        out = _attn_flex(q, k, v, meta, scale, kernels)
    else:
        fn = {"flash": _attn_flash, "sdpa": _attn_sdpa, "reference": _attn_reference}[name]
        out = fn(q, k, v, meta, scale)
    if q.shape[0] == 0 and needs_grad:
        # A rank with no query (a CP rank left empty) must still back-propagate through k and v: under CP they come
        # from a collective whose backward every rank of the group has to join.
        out = out + 0.0 * (k.sum() + v.sum())
    return out


def _attn_reference(q, k, v, meta: VarlenMeta, scale: float) -> torch.Tensor:
    rep = q.shape[1] // k.shape[1]
    cu, ks, kl = meta.host
    outs = []
    for s in range(len(kl)):
        qs = q[cu[s] : cu[s + 1]].transpose(0, 1)  # [H, Lq, D]
        kk = k[ks[s] : ks[s] + kl[s]].repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, Lk, D]
        vv = v[ks[s] : ks[s] + kl[s]].repeat_interleave(rep, dim=1).transpose(0, 1)
        lq, lk = qs.shape[1], kk.shape[1]
        scores = torch.matmul(qs, kk.transpose(1, 2)) * scale
        allowed = (torch.arange(lk, device=q.device)[None, :]
                   <= torch.arange(lq, device=q.device)[:, None] + (lk - lq))
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.matmul(torch.softmax(scores, dim=-1), vv).transpose(0, 1))
    return torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)


def _attn_sdpa(q, k, v, meta: VarlenMeta, scale: float) -> torch.Tensor:
    """One SDPA call per segment: causal (flash kernel on CPU and GPU) when a segment's queries and keys coincide,
    else with the segment's own bottom-right [Lq, Lk] mask (CP pieces). Never a [Tq, Tk] mask over the micro-batch,
    so time and memory follow sum of l^2 over documents, not (sum of l)^2. On CUDA, never cuDNN's kernel
    (:data:`SDPA_CUDA_KERNELS`)."""
    if q.is_cuda:
        with sdpa_kernel(list(SDPA_CUDA_KERNELS)):
            return _sdpa_segments(q, k, v, meta, scale)
    return _sdpa_segments(q, k, v, meta, scale)


def _sdpa_segments(q, k, v, meta: VarlenMeta, scale: float) -> torch.Tensor:
    gqa = q.shape[1] != k.shape[1]
    cu, ks, kl = meta.host
    outs = []
    for s in range(len(kl)):
        lq, lk = cu[s + 1] - cu[s], kl[s]
        if lq == 0:
            continue
        qs = q[cu[s] : cu[s + 1]].transpose(0, 1)[None]
        kk = k[ks[s] : ks[s] + lk].transpose(0, 1)[None]
        vv = v[ks[s] : ks[s] + lk].transpose(0, 1)[None]
        if lq == lk:
            o = F.scaled_dot_product_attention(qs, kk, vv, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            ar = torch.arange(lk, device=q.device)
            allowed = ar[None, :] <= ar[:lq, None] + (lk - lq)
            o = F.scaled_dot_product_attention(qs, kk, vv, attn_mask=allowed, scale=scale, enable_gqa=gqa)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)


def pick_backend(meta: VarlenMeta, q: torch.Tensor, needs_grad: bool,
                 kernels: AttentionKernels | None = None) -> str:
    """The backend "mixed" runs for the micro-batch of `meta`: the rule's pick (``kernels.rule``; without kernels,
    :data:`~tidal.core.attnrule.H200_RULE`) from the host lists and q's head count and width, made on the first
    layer and cached on `meta` (every layer shares it; nothing read from the device), then resolved where it runs
    (a flex pick on CPU with gradients runs sdpa). Each micro-batch is counted once in ``kernels.picks``."""
    rule = kernels.rule if kernels is not None else H200_RULE
    key = ("backend_pick", rule, int(q.shape[1]), int(q.shape[2]), needs_grad)
    if key not in meta.cache:
        cu, _, kl = meta.host
        pick = rule.pick([cu[s + 1] - cu[s] for s in range(len(kl))], kl, int(q.shape[1]), int(q.shape[2]))
        meta.cache[key] = resolve_backend(pick, q, needs_grad)
        if kernels is not None and ("backend_counted", id(kernels)) not in meta.cache:
            meta.cache[("backend_counted", id(kernels))] = True
            kernels.picks[meta.cache[key]] = kernels.picks.get(meta.cache[key], 0) + 1
    return meta.cache[key]


def flex_block_mask(meta: VarlenMeta, tq: int, tk: int, device: torch.device):
    """The micro-batch's FlexAttention block mask, built on first use and then shared by every layer."""
    key = ("flex_block_mask", str(device), tq, tk)
    if key not in meta.cache:
        _, create_block_mask = _flex_fn()
        lo, hi = (t.to(device) for t in meta.key_bounds())  # already there when the meta is on `device`

        def mask_mod(b, h, qi, ki):
            return (ki >= lo[qi]) & (ki < hi[qi])

        meta.cache[key] = create_block_mask(mask_mod, None, None, tq, tk, device=str(device))
    return meta.cache[key]


class AttentionKernels:
    """Compiled kernels one model shares across its layers and micro-batches (today: FlexAttention on CUDA).
    Dynamo guards a compiled frame on the `torch.compile` wrapper that produced it, so the wrapper must live as long
    as the model: a fresh `torch.compile(flex_attention)` per call would recompile every call. Also the model's
    "mixed" rule (a value passed in, default :data:`~tidal.core.attnrule.H200_RULE`) and ``picks``, the
    micro-batches each backend ran under it."""

    def __init__(self, rule: AttnBackendRule = H200_RULE) -> None:
        if not isinstance(rule, AttnBackendRule):
            raise TidalError(f"the attention backend rule must be an AttnBackendRule, got {type(rule).__name__}")
        self._flex = None
        self.rule = rule  # "mixed": sdpa or flex per micro-batch (core/attnrule.py)
        self.picks: dict[str, int] = {}  # "mixed": backend -> micro-batches it ran (counted once per micro-batch)

    def flex(self, cuda: bool):
        fn, _ = _flex_fn()
        if not cuda:
            return fn  # eager (CPU, no grad only); see the module docstring
        if self._flex is None:
            self._flex = torch.compile(fn)
        return self._flex


def _attn_flex(q, k, v, meta: VarlenMeta, scale: float, kernels: AttentionKernels | None = None) -> torch.Tensor:
    if not torch.is_grad_enabled():  # FlexAttention rejects CPU inputs that merely carry requires_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    bm = flex_block_mask(meta, q.shape[0], k.shape[0], q.device)
    flex_attention = (kernels if kernels is not None else AttentionKernels()).flex(q.is_cuda)
    out = flex_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=bm,
                         scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)


def _flash_keys(meta: VarlenMeta, tk: int, device: torch.device):
    """(key row index or None, cu_seqlens_k, cu_seqlens_q; both int32) for flash-attn, built once per micro-batch
    from the host lists and shared by every layer: overlapping key ranges (CP) are materialised by gathering each
    segment's keys."""
    key = ("flash_keys", str(device), tk)
    if key not in meta.cache:
        _, ks, kl = meta.host
        cu_k = [0]
        for n in kl:
            cu_k.append(cu_k[-1] + n)
        contiguous = all(ks[s] + kl[s] == (ks[s + 1] if s + 1 < len(ks) else tk) for s in range(len(ks)))
        idx = None
        if not (contiguous and (not ks or ks[0] == 0)):
            idx = torch.cat([torch.arange(a, a + b, dtype=torch.int64, device="cpu") for a, b in zip(ks, kl)])
        packed = torch.cat([torch.tensor(cu_k, dtype=torch.int64, device="cpu")] + ([] if idx is None else [idx]))
        packed = packed.to(device, non_blocking=True)  # one copy per micro-batch
        meta.cache[key] = (None if idx is None else packed[len(cu_k):], packed[: len(cu_k)].to(torch.int32),
                           meta.cu_seqlens_q.to(device, torch.int32))
    return meta.cache[key]


def _attn_flash(q, k, v, meta: VarlenMeta, scale: float) -> torch.Tensor:  # pragma: no cover - needs a GPU
    fn = _flash_fn()
    idx, cu_k, cu_q = _flash_keys(meta, k.shape[0], q.device)
    kk, vv = (k, v) if idx is None else (k.index_select(0, idx), v.index_select(0, idx))
    return fn(q, kk, vv, cu_q, cu_k, meta.max_seqlen_q, meta.max_seqlen_k, softmax_scale=scale, causal=True)
