"""Memory model: MaxLen(P), the Hydraulis App. C.1 linear model under optimization-propagation disaggregation,
in two charges (`MemoryConfig.mode`): "app-c1", the planner's default so far (12 B/param master states / N + 4 B/param
16-bit parameters and gradients of the stage / t, activations beside), and "executor", what the executor really
holds (runtime/executor.py; measured by benchmarks/resident_memory.py), below.

Per device of stage s of scheme P = <t, p, c> in a job of N devices, with w = the stage's local parameters (its layers,
embedding and head, split by TP; norm weights replicated) and P_all the model's parameters, the executor's states go
through three peaks in a step (no other candidate holds anything: its buffers have no storage while idle):
  pull      = w * param_B                   the running stage's parameters (compute dtype, one flat buffer)
            + w_W * param_B                 the pull's window (decision 75): the groups posted when it starts, every
                                             group up to the W-th this device receives into (`pull_posted`; w_W: the
                                             local parameters of those it receives, P_W: all their parameters):
                                             output buffers,
            + w_W (1 - 1/N) * param_B       receive buffers of the rows others own,
            + (P_W R - w_W) / N * param_B   packed sends of this device's rows to the R copies' other holders
                                             (R = copies of the model in the strategy, N / (t p) when all is P)
            + P_all / N * master_B          fp32 master weights + Adam m, v, fully sharded over all N devices
            + G_max / N * cast_B            one group's master rows cast to the compute dtype while it is posted
                                             (released once its sends are packed; G_max: the largest group)
  backward  = w * (param_B + grad_B) + P_all / N * master_B + fly
                                             parameters + the fp32 gradient accumulation buffers (main_grad), and
  fly       = sum over the push's first W groups (in push order: the head, then the last layers) of
              G_j * shard_grad_B * (R + 2) / N   (R = 1: 2 / N, or 0 in the backward for a group held here)
                                             the push's window (decision 75), posted from the backward: each group
                                             swaps its gradients for its packed sends and adds the receive, reduction
                                             and output buffers of the rows this device owns
  push      = P_all / N * master_B + fly
            + max over q >= W of (grad_B * own local parameters of push groups >= q
                                  + shard_grad_B * parameters of push groups < q / N)
                                             parameters freed; after the backward the push walks the remaining groups
                                             in order: the gradients of this device's groups not yet posted, and the
                                             gradient shards (its output, held until the optimizer step) of those
                                             before them (a first stage's own groups come last)
  peak      = max(backward + pull sends of groups not held here + activations, pull, push)
                                             (the forward releases each pull group's buffers before that group's
                                             activations exist, so the pull's peak has none; the push follows the
                                             backward)
  activations = A_r * L_s * p * l / c + R * l / c
                 every layer of the stage keeps activations for up to p in-flight micro-batches under 1F1B
                 (L_s * p >= layers, Hydraulis' "accumulated PP times" peak), A_r bytes per token per layer by the
                 stage's recomputation (`MemoryConfig.recompute`, decision 90), with A = (act_bytes_per_token_layer
                 / t + act_bytes_tp_replicated) * h:
                   none       A_r = A, R = 0
                   selective  A_r = A - attn_core_bytes_per_token_head * heads / t (what the attention core saves
                              beyond q, k, v and its output: flash's fp32 logsumexp), R = 0
                   full       A_r = recompute_input_bytes * h (the layer's input only, replicated over TP),
                              R = A: one layer's activations live again while its backward recomputes it
               + last stage: fp32 logits and their gradient, 8 * vocab / t bytes per local token
  budget       = memory * (1 - margin_frac) - min(workspace_bytes, workspace_max_frac * memory)
                 (the fixed workspace is capped so a small device, e.g. a 2 GiB CPU rank, keeps a budget)
MaxLen(P) = floor((budget - states) / per_token), 0 when even the states do not fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import nnls

from tidal.core.cluster import DeviceType
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.core.recompute import parse_recompute, stage_recompute
from tidal.core.scheme import ParallelScheme


@dataclass(frozen=True)
class MemoryConfig:
    # Activation bytes per token per hidden unit per layer: act_bytes_per_token_layer / TP + act_bytes_tp_replicated
    # (the part TP does not split), both / CP. Fit on Hydraulis' four strategy pools' measured A[tp] (A = 36 + 1.25 tp
    # within 6 B, docs/costmodel.md); v1 (`MEMORY_V1`): Korthikanti et al. 2022's 34 with sequence parallelism,
    # nothing replicated.
    act_bytes_per_token_layer: float = 36.0
    act_bytes_tp_replicated: float = 1.25
    # The last stage's logits per token per vocabulary entry (/ TP, / CP): 8 B, an fp32 logit and its gradient (App.
    # C.1's charge, kept for the planner's pinned figures). `executor_memory` charges what the loss path holds at its
    # peak (`LOGIT_BYTES`, measured on an H200 by benchmarks/act_bytes.py, docs/costmodel.md).
    logit_bytes_per_vocab: float = 8.0
    master_bytes_per_param: float = 12.0  # fp32 master + Adam m, v (sharded over all N)
    shard_grad_bytes_per_param: float = 4.0  # the push's fp32 gradient shards (sharded over all N), until the update
    param_bytes_per_param: float = 2.0  # the running stage's parameters in the compute dtype (bf16)
    grad_bytes_per_param: float = 4.0  # its gradient accumulation buffer (fp32 for a 16-bit compute dtype)
    pull_window: int = 2  # the pull's parameter groups this device receives into, in flight at once (decision 75)
    pull_cast_bytes_per_param: float = 2.0  # a group's master rows cast to the compute dtype while posted (0: same)
    push_buffer_factor: float = 1.0  # x the push's buffers of one parameter group (sends + receives, module docstring)
    push_window: int = 2  # the push's parameter groups in flight at once (decision 75)
    # "app-c1": the planner's charge so far (Hydraulis App. C.1: 12 B/param master states / N + 4 B/param 16-bit
    # parameters and gradients of the stage / t, activations beside); "executor": what the executor holds, by phase
    # (`resident_bytes`; measured within 10 %). The default stays "app-c1" until the planner's pinned figures are
    # re-measured under "executor" (decision 72: it lowers MaxLen, e.g. llama2-13b tp1 on a800x16 1132 -> 0).
    mode: str = "app-c1"
    app_c1_model_bytes_per_param: float = 4.0
    margin_frac: float = 0.10
    workspace_bytes: float = 2e9
    workspace_max_frac: float = 0.10
    # activation recomputation per stage (decision 90): one mode or one per stage (core/recompute.py); "none" keeps
    # every figure of the model as before
    # or "auto" (`auto_recompute`): per scheme, the cheapest mode whose MaxLen reaches `recompute_need` tokens
    recompute: tuple[str, ...] | str = ("none",)
    recompute_need: int = 0
    recompute_input_bytes: float = 2.0  # full: bytes per token per hidden unit per layer kept (the 16-bit input)
    # 0: a layer's activations are act_bytes_per_token * hidden (the per-hidden-unit constant above, fitted on
    # Hydraulis' pools). > 0 (the executor charge, `executor_memory`): counted from the layer's shape, the tensors this
    # runtime's decoder layer saves for the backward, at this many bytes per element (`shape_act_bytes`)
    act_element_bytes: float = 0.0
    # ffn-wide tensors per token the layer saves (`shape_act_bytes`): gate, up, SiLU output and product (4) eagerly;
    # 3 with SwiGLU's gate compiled (`[model] compile = "dense"`, models/dense.py: the SiLU output is recomputed)
    act_ffn_tensors: float = 4.0
    attn_core_bytes_per_token_head: float = 4.0  # selective frees this per token per query head per layer (fp32 LSE)

    def __post_init__(self) -> None:
        if self.recompute in ("auto", ("auto",)):
            if self.recompute_need < 1:
                raise TidalError(f"memory recompute auto needs recompute_need >= 1, got {self.recompute_need}")
            object.__setattr__(self, "recompute", ("auto",))
        else:
            object.__setattr__(self, "recompute", parse_recompute(self.recompute))
        if not 0 <= self.margin_frac < 1:
            raise TidalError(f"memory margin_frac must be in [0, 1), got {self.margin_frac}")
        if self.pull_window < 1 or self.push_window < 1:
            raise TidalError(f"memory pull_window and push_window must be at least 1, got {self.pull_window}, "
                             f"{self.push_window}")
        if self.mode not in ("app-c1", "executor"):
            raise TidalError(f"memory mode must be app-c1 or executor, got {self.mode!r}")

    @property
    def model_bytes_per_param(self) -> float:
        """Bytes per parameter of the running stage: parameters plus gradients."""
        if self.mode == "app-c1":
            return self.app_c1_model_bytes_per_param
        return self.param_bytes_per_param + self.grad_bytes_per_param


MEMORY_V1 = MemoryConfig(act_bytes_per_token_layer=34.0, act_bytes_tp_replicated=0.0)  # before decision 76


def act_bytes_per_token(cfg: MemoryConfig, tp: int) -> float:
    """Activation bytes per token per hidden unit per layer on one device of a TP group of `tp` (before CP)."""
    return cfg.act_bytes_per_token_layer / tp + cfg.act_bytes_tp_replicated


def shape_act_bytes(model: ModelSpec, tp: int, elem: float, ffn_tensors: float = 4.0) -> float:
    """Bytes per token one decoder layer of `models/llama.py` saves for its backward on one device of a TP group of
    `tp`, counted from its shape with `elem` bytes per element: the layer input, the attention norm's output, the
    residual sum and the MLP norm's output (4 h, replicated over TP); q, k, v, rotated q and k and the attention
    output (3 h + 3 kv / TP); the MLP's gate and up outputs, SiLU output and their product (`ffn_tensors` = 4 ffn /
    TP; 3 when the gate is compiled, decision 140); and the attention's fp32 log-sum-exp per query head. Checked
    against the H200's measured peaks (docs/costmodel.md)."""
    split = 3 * model.hidden + 3 * model.kv_dim + ffn_tensors * model.ffn
    return elem * (4 * model.hidden + split / tp) + 4.0 * model.heads / tp


def layer_act_bytes(model: ModelSpec, cfg: MemoryConfig, tp: int, mode: str) -> tuple[float, float]:
    """(bytes per token one layer keeps per in-flight micro-batch, bytes per token live once while the backward
    recomputes a layer) on one device of a TP group of `tp`, before CP, under recomputation `mode` (module
    docstring)."""
    full = (shape_act_bytes(model, tp, cfg.act_element_bytes, cfg.act_ffn_tensors) if cfg.act_element_bytes > 0
            else act_bytes_per_token(cfg, tp) * model.hidden)
    if mode == "none":
        return full, 0.0
    if mode == "selective":
        return max(0.0, full - cfg.attn_core_bytes_per_token_head * model.heads / tp), 0.0
    if mode == "full":
        return cfg.recompute_input_bytes * model.hidden, full
    raise TidalError(f"unknown recompute mode {mode!r}")


def stage_act_per_token(model: ModelSpec, scheme: ParallelScheme, stage: int, cfg: MemoryConfig) -> float:
    """Activation bytes per micro-batch token on one device of `stage` at its peak (module docstring), the last
    stage's logits and their gradients included (`logit_bytes_per_vocab`)."""
    t, c, p = scheme.tp, scheme.cp, scheme.pp
    stages = scheme.stage_layers(model.layers)
    kept, again = layer_act_bytes(model, cfg, t, stage_recompute(cfg.recompute, stage))
    out = (kept * stages[stage] * p + (again if stages[stage] else 0.0)) / c
    if stage == len(stages) - 1:
        out += cfg.logit_bytes_per_vocab * model.vocab / (t * c)
    return out


DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
# Bytes per token per vocabulary entry that the loss path holds at its peak, by compute dtype: cross_entropy on the
# logits upcast to fp32 keeps the fp32 log-softmax for the backward (4); the backward adds the dense fp32 gradient of
# the log-probabilities (4) and of the logits (4), and, for a 16-bit compute dtype, its cast back (2). float64: twice
# float32's.
LOGIT_BYTES = {"float64": 24.0, "float32": 12.0, "bfloat16": 14.0, "float16": 14.0}


def executor_memory(compute: str, master: str, base: MemoryConfig | None = None, compile: str = "off") -> MemoryConfig:
    """The "executor" charge of a run that computes in `compute` and keeps master weights and Adam moments in
    `master` (dtype names): parameters in the compute dtype, the gradient buffer in at least fp32, 3 master tensors
    (weights, m, v) and the push's gradient shards in the master dtype, and the cast of the master shards for the pull
    unless the two dtypes agree; activations counted from the layer's shape in the compute dtype, and the loss path's
    logits (`LOGIT_BYTES`); with `compile` "dense" (decision 140) the SwiGLU gate saves one ffn-wide tensor fewer.
    `tidal train` plans with it (the executor's own bytes)."""
    for name in (compute, master):
        if name not in DTYPE_BYTES:
            raise TidalError(f"unknown dtype {name!r}; one of {', '.join(DTYPE_BYTES)}")
    cb, mb = DTYPE_BYTES[compute], DTYPE_BYTES[master]
    return replace(base or MemoryConfig(), mode="executor", param_bytes_per_param=cb, grad_bytes_per_param=max(cb, 4),
                   act_element_bytes=cb,
                   master_bytes_per_param=3 * mb, shard_grad_bytes_per_param=mb,
                   pull_cast_bytes_per_param=0 if compute == master else cb, recompute_input_bytes=cb,
                   logit_bytes_per_vocab=LOGIT_BYTES[compute], act_ffn_tensors=3.0 if compile == "dense" else 4.0)


def stage_params(model: ModelSpec, scheme: ParallelScheme, stage: int) -> tuple[float, float]:
    """(local parameters of `stage` on one of its devices, the largest parameter group among them): matrices split by
    TP, norm weights replicated; the last stage of a tied model with PP > 1 holds its own copy of the embedding."""
    t = scheme.tp
    stages = scheme.stage_layers(model.layers)
    layer = (model.layer_params() - 2 * model.hidden) / t + 2 * model.hidden
    emb = model.vocab * model.hidden / t
    L = stages[stage]
    total, group = L * layer, (layer if L else 0.0)
    if stage == 0:
        total += emb
        group = max(group, emb)
    if stage == len(stages) - 1:
        head = 0.0 if (model.tie_embeddings and len(stages) == 1) else emb
        total += model.hidden + head
        group = max(group, model.hidden + head)
    return total, group


def pull_groups(model: ModelSpec, scheme: ParallelScheme, stage: int) -> list[tuple[float, float | None]]:
    """The model's parameter groups in the executor's forward order (embedding, each layer, final norm + head): per
    group (its parameters, its local parameters on a device of `stage`, None where the stage holds none). A tied
    embedding's head is the embedding's group (held by the first and, under PP, the last stage)."""
    t, h, emb = scheme.tp, model.hidden, model.vocab * model.hidden
    stages = scheme.stage_layers(model.layers)
    last = stage == len(stages) - 1
    layer = model.layer_params()
    layer_local = (layer - 2 * h) / t + 2 * h
    first = sum(stages[:stage])
    out: list[tuple[float, float | None]] = [(emb, emb / t if stage == 0 or (last and model.tie_embeddings) else None)]
    out += [(layer, layer_local if first <= i < first + stages[stage] else None) for i in range(model.layers)]
    head = 0.0 if model.tie_embeddings else emb
    out.append((h + head, h + head / t if last else None))
    return out


def pull_posted(model: ModelSpec, scheme: ParallelScheme, stage: int, window: int) -> tuple[float, float]:
    """(parameters of the groups posted when the pull starts, the local parameters of those this device receives):
    every group up to the `window`-th one it receives into, and the groups it only sends from after that one until
    its next (runtime/streams.py PullStream)."""
    posted = received = 0.0
    count = 0
    for full, local in pull_groups(model, scheme, stage):
        if local is not None:
            if count == window:
                break
            count += 1
            received += local
        posted += full
    return posted, received


def resident_bytes(model: ModelSpec, scheme: ParallelScheme, n_devices: int, stage: int, cfg: MemoryConfig,
                   replicas: float | None = None, pull_wire_bytes: float | None = None) -> dict[str, float]:
    """Bytes one device of `stage` holds at each of the step's three peaks (module docstring), activations aside.
    `replicas`: copies of the model the step's strategy holds over the world (sum over its pipelines of CP), which
    sets how many devices each owner sends its rows to in the pull; default N / (t p), a strategy of this scheme
    alone. `pull_wire_bytes`: this device's pull bytes sent + received as the pull plans give them (the executor
    knows them at start-up), instead of the closed form, which cannot know which rows a placement keeps local (TP's
    row split can coincide with the owners' split: tp4 on 4 devices copies its row-split weights locally)."""
    w, _ = stage_params(model, scheme, stage)
    n_all = model.num_params()
    master = cfg.master_bytes_per_param * n_all / n_devices
    pb, gb = cfg.param_bytes_per_param, cfg.grad_bytes_per_param
    r = n_devices / (scheme.tp * scheme.pp) if replicas is None else replicas
    # the push's window (decision 75): its first W groups in push order (the head, then the last layers) are posted
    # from the backward; each swaps its gradients for its packed sends and adds the receive, reduction and output
    # buffers of the rows this device owns: (r + 2) / N of the group with r > 1 addends, 2 / N with one (none in the
    # backward for a group held here: its sends replace its gradients), in the master dtype
    order = pull_groups(model, scheme, stage)[::-1]
    mb, win = cfg.shard_grad_bytes_per_param, cfg.push_window

    def fly(after_backward: bool) -> float:
        share = [(r + 2.0) if r > 1 else (2.0 if after_backward or local is None else 0.0) for _, local in order[:win]]
        return cfg.push_buffer_factor * mb * sum(f * k for (f, _), k in zip(order, share)) / n_devices

    # after the backward the push walks the rest in order: this device still holds the gradients of its groups not
    # yet posted while the shards of the groups before them have landed (a first stage's own groups come last)
    held = [local or 0.0 for _, local in order]
    walk = max(gb * sum(held[q:]) + mb * sum(f for f, _ in order[:q]) / n_devices
               for q in range(min(win, len(order)), len(order) + 1))
    # the pull starts with the groups up to the window's last (pull_posted): their outputs, receives and sends
    posted, got = pull_posted(model, scheme, stage, cfg.pull_window)
    cast = max(full for full, _ in pull_groups(model, scheme, stage))  # one group's master rows cast while posting
    recv = got * (1.0 - 1.0 / n_devices)  # the rows of the posted groups that other devices own
    send = max(0.0, posted * r - got) / n_devices  # this device's rows of them to every other holder
    return {
        "pull": (w + got) * pb + master + cfg.pull_cast_bytes_per_param * cast / n_devices
        + ((recv + send) * pb if pull_wire_bytes is None else pull_wire_bytes),
        "backward": w * (pb + gb) + master + fly(False),
        "push": master + walk + fly(True),
    }


def _phase_lines(model: ModelSpec, scheme: ParallelScheme, n_devices: int, cfg: MemoryConfig) -> list[list[tuple]]:
    """Per stage, (fixed bytes, bytes per micro-batch token) of each phase that can be the peak. Mode "app-c1": one
    line, master states + 4 B/param of the stage / t + activations. Mode "executor": the backward phase
    with the activations (and the pull's packed sends of groups this device does not hold, completed only after the
    backward), and the pull and push phases without them (the forward releases each pull group's buffers before
    that group's activations exist; the push starts after the backward)."""
    t, p = scheme.tp, scheme.pp
    stages = scheme.stage_layers(model.layers)
    n_all = model.num_params()
    out = []
    if cfg.mode == "app-c1":
        master = cfg.master_bytes_per_param * n_all / n_devices
        emb = model.vocab * model.hidden
        for s, L in enumerate(stages):
            params = L * model.layer_params()
            if s == 0:
                params += emb
            if s == len(stages) - 1:
                params += model.hidden + (0 if model.tie_embeddings else emb)
            act_per_tok = stage_act_per_token(model, scheme, s, cfg)
            out.append([(master + cfg.model_bytes_per_param * params / t, act_per_tok)])
        return out
    for s in range(len(stages)):
        res = resident_bytes(model, scheme, n_devices, s, cfg)
        w, _ = stage_params(model, scheme, s)
        # each group held elsewhere: this device's rows of it to its N / (t p) holders
        sends = max(0.0, n_all - w * t) / n_devices * n_devices / (t * p) * cfg.param_bytes_per_param
        act_per_tok = stage_act_per_token(model, scheme, s, cfg)
        out.append([(res["backward"] + sends, act_per_tok), (res["pull"], 0.0), (res["push"], 0.0)])
    return out


def stage_memory(model: ModelSpec, scheme: ParallelScheme, n_devices: int, tokens: float,
                 cfg: MemoryConfig) -> list[float]:
    """Peak bytes per device of every stage for a micro-batch of `tokens` tokens: the largest of its phases."""
    return [max(f + a * tokens for f, a in lines) for lines in _phase_lines(model, scheme, n_devices, cfg)]


def states_bytes(model: ModelSpec, scheme: ParallelScheme, n_devices: int, cfg: MemoryConfig) -> tuple[float, float]:
    """(the worst stage's states beside the activations, the largest pull or push peak of any stage)."""
    lines = _phase_lines(model, scheme, n_devices, cfg)
    return max(ls[0][0] for ls in lines), max((f for ls in lines for f, _ in ls[1:]), default=0.0)


def budget_bytes(device: DeviceType, cfg: MemoryConfig) -> float:
    """Bytes a device offers to states and activations after the safety margin and workspace."""
    mem = device.memory_bytes
    return mem * (1 - cfg.margin_frac) - min(cfg.workspace_bytes, cfg.workspace_max_frac * mem)


AUTO_ORDER = ("none", "selective", "full")  # cheapest extra compute first


def auto_recompute(model: ModelSpec, scheme: ParallelScheme, device: DeviceType, n_devices: int,
                   cfg: MemoryConfig) -> tuple[str, ...]:
    """Per stage, the mode `scheme` runs under `cfg.recompute`: the fixed modes, or for "auto" the first of none,
    selective, full whose MaxLen reaches `cfg.recompute_need` (none when no mode does)."""
    if cfg.recompute != ("auto",):
        return tuple(stage_recompute(cfg.recompute, s) for s in range(scheme.pp))
    for mode in AUTO_ORDER:
        if max_len(model, scheme, device, n_devices, replace(cfg, recompute=(mode,))) >= cfg.recompute_need:
            return (mode,) * scheme.pp
    return ("none",) * scheme.pp


def max_len(model: ModelSpec, scheme: ParallelScheme, device: DeviceType, n_devices: int, cfg: MemoryConfig) -> int:
    if cfg.recompute == ("auto",):
        cfg = replace(cfg, recompute=auto_recompute(model, scheme, device, n_devices, cfg))
    budget = budget_bytes(device, cfg)
    lines = [x for ls in _phase_lines(model, scheme, n_devices, cfg) for x in ls]
    if any(f > budget for f, _ in lines):
        return 0
    best = min((budget - f) / a for f, a in lines if a > 0)
    return max(0, int(best))


@dataclass(frozen=True)
class ActivationFit:
    """Measured activation bytes of one micro-batch on the worst rank: m0 + m1 * sum(l) + m2 * sum(l^2)."""

    m0: float
    m1: float
    m2: float
    rows: int
    source: str  # "saved-tensors" (CPU: autograd-saved bytes) or "cuda-peak" (torch.cuda.max_memory_allocated)

    def bytes_at(self, length: float) -> float:
        """Bytes of a one-document micro-batch of `length` tokens (the worst composition of that many tokens)."""
        return self.m0 + self.m1 * length + self.m2 * length * length


def fit_activation_bytes(points, source: str) -> ActivationFit:
    """NNLS of [1, sum l, sum l^2] -> bytes over (lengths, bytes) points, in relative error."""
    pts = [(tuple(ls), float(b)) for ls, b in points if b > 0]
    if len(pts) < 3:
        raise TidalError(f"need >= 3 positive activation measurements to fit memory, got {len(pts)}")
    X = np.array([[1.0, float(sum(ls)), float(sum(x * x for x in ls))] for ls, _ in pts])
    y = np.array([b for _, b in pts])
    scale = X.max(axis=0)
    sol, _ = nnls(X / scale / y[:, None], np.ones_like(y))
    m0, m1, m2 = (float(v) for v in sol / scale)
    return ActivationFit(m0, m1, m2, len(pts), source)


def measured_max_len(model: ModelSpec, scheme: ParallelScheme, device: DeviceType, n_devices: int,
                     act: ActivationFit, cfg: MemoryConfig) -> int:
    """MaxLen from measured activations: the largest L with states + PP * act(L) <= budget on the worst rank. The
    states (:func:`resident_bytes`: master and Adam shards, this stage's parameters, gradients and pull/push
    buffers) are the analytic model's; 1F1B keeps up to PP micro-batches' activations on the first stage (as the
    analytic model)."""
    budget = budget_bytes(device, cfg)
    states, transient = states_bytes(model, scheme, n_devices, cfg)
    if transient > budget:
        return 0
    room = (budget - states) / scheme.pp - act.m0
    if room <= 0:
        return 0
    if act.m2 > 0:
        length = (-act.m1 + math.sqrt(act.m1 * act.m1 + 4 * act.m2 * room)) / (2 * act.m2)
    elif act.m1 > 0:
        length = room / act.m1
    else:
        raise TidalError(f"{scheme}: measured activation bytes do not grow with length; cannot derive MaxLen")
    return max(0, int(length))
