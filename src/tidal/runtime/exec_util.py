"""Small helpers of the executor: pull groups in forward order, per-rank message bytes, a step's tokens, and the
`fetch` function over a token corpus."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from tidal.core.plan import StepPlan


def _param_groups(table) -> tuple[list[list[int]], dict[str, int]]:
    """Pull groups in forward order: the embedding, each layer, the final norm and head; and the module prefix whose
    forward pre-hook completes each group."""
    groups: dict[str, list[int]] = {}
    for i, info in enumerate(table):
        key = {"embed": "tok_embeddings", "head": "head"}.get(str(info.owner), f"layers.{info.owner}")
        groups.setdefault(key, []).append(i)
    order = list(groups)
    module_group = {prefix: order.index(prefix) for prefix in order if prefix != "head"}
    if "head" in groups:
        module_group["norm"] = order.index("head")
        module_group["output"] = order.index("head")
    return [groups[k] for k in order], module_group


def _has_submodule(model: torch.nn.Module, prefix: str) -> bool:
    try:
        return model.get_submodule(prefix) is not None
    except AttributeError:
        return False


def _bytes(plan, rank: int) -> int:
    st = plan.stats.get(rank)
    return 0 if st is None else st.send + st.recv


def step_tokens(step: StepPlan) -> int:
    return sum(step.seq_lengths[i] for p in step.pipelines for mb in p.micro_batches for i in mb)


def fetch_from(docs: Sequence[tuple[int, int, int]], corpus) -> Callable[[int], torch.Tensor]:
    """`fetch` for Executor.train_step over a token corpus: sequence j is (doc_id, start, length) of `docs`."""

    def fetch(j: int) -> torch.Tensor:
        doc, start, length = docs[j]
        return torch.from_numpy(np.asarray(corpus.tokens(doc, start, length), dtype=np.int64))

    return fetch


__all__ = ["fetch_from", "step_tokens"]
