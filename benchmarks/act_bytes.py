"""Activation bytes of the model's forward + loss + backward, measured, against the memory model's charge.

For a model shape (preset or TOML `[model]`), builds `models.Llama` with `--layers-a` and `--layers-b` layers at the
compute dtype, gives every parameter its gradient buffer up front (so the peak holds activations and transients, not
the gradients), and runs one micro-batch of T tokens (documents of `--doc-len`) for each T of `--tokens`. The peak
above the parameters and gradients is split by least squares into

    peak(L, T) = T * (L * hidden * A + vocab * B) + c

A: bytes per token per hidden unit per layer; B: bytes per token per vocabulary entry (logits, the upcast, the
log-softmax and their gradients). Printed beside the memory model's executor charge: A from the layer's shape
(`shape_act_bytes`, TP 1) and B (`LOGIT_BYTES`). On CUDA the peak is `torch.cuda.max_memory_allocated`; on the CPU,
where there is no allocator peak, the figure is the bytes autograd saves for the backward (saved-tensor hooks,
deduplicated by storage), a lower bound of the peak.

    python benchmarks/act_bytes.py --model llama3.2-1b --tokens 4096,8192,16384      # on a GPU
    python benchmarks/act_bytes.py --model tiny --tokens 256,512,1024                  # CPU: saved bytes
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from tidal.costmodel.memory import LOGIT_BYTES, shape_act_bytes
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.runtime.config import model_arg


def peak_bytes(spec, tokens: int, doc_len: int, device: torch.device, dtype: torch.dtype, backend: str) -> float:
    torch.manual_seed(0)
    model = Llama(spec, backend).to(device=device, dtype=dtype)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    lens = [doc_len] * (tokens // doc_len) + ([tokens % doc_len] if tokens % doc_len else [])
    toks = torch.randint(0, spec.vocab, (tokens + 1,), device=device)
    batch = VarlenBatch.from_lengths(lens, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss_sum(model(toks[:-1], batch), toks[1:]).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        seen: dict[int, int] = {}
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

        def pack(t: torch.Tensor):
            st = t.untyped_storage()
            if st.data_ptr() not in weights:
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_sum(model(toks[:-1], batch), toks[1:])
        peak = float(sum(seen.values()))
        loss.backward()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return float(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3.2-1b", help="preset or TOML with a [model] section")
    ap.add_argument("--layers-a", type=int, default=1)
    ap.add_argument("--layers-b", type=int, default=3)
    ap.add_argument("--tokens", default="4096,8192,16384")
    ap.add_argument("--doc-len", type=int, default=2048)
    ap.add_argument("--dtype", default="", help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--attn-backend", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dname = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dname)
    base = model_arg(args.model).spec()
    rows, ys = [], []
    for layers in (args.layers_a, args.layers_b):
        spec = dataclasses.replace(base, layers=layers)
        for t in (int(x) for x in args.tokens.split(",")):
            y = peak_bytes(spec, t, args.doc_len, device, dtype, args.attn_backend)
            rows.append([t * layers * base.hidden, t * base.vocab, 1.0])
            ys.append(y)
            print(f"layers {layers:2d} tokens {t:6d}: {'peak' if device.type == 'cuda' else 'saved'} "
                  f"{y / 2**30:8.3f} GiB")
    (a, b, c), *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    fit = np.array(rows) @ np.array([a, b, c])
    worst = float(np.max(np.abs(fit - np.array(ys)) / np.array(ys)))
    print(f"{base.name}, {dname}, {device.type}: A = {a:.1f} B per token per hidden unit per layer, B = {b:.2f} B per "
          f"token per vocabulary entry, c = {c / 2**20:.0f} MiB (fit within {worst:.1%})")
    elem = torch.finfo(dtype).bits / 8
    print(f"memory model (executor charge): A = {shape_act_bytes(base, 1, elem) / base.hidden:.2f} (layer shape), "
          f"B = {LOGIT_BYTES[dname]:.1f}")


if __name__ == "__main__":
    main()
