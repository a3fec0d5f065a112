"""Tidal's planner driving a plain PyTorch training loop with its own data loader (docs/library.md).

    python examples/library_loop.py --steps 3

The loop owns everything but the plan: its data loader yields a step's documents, `Planner.plan` says which strategy
the step runs and which documents each pipeline packs into which micro-batch, and the loop trains them. Here one
process plays every pipeline in turn (gradients accumulate as a data-parallel all-reduce would sum them); in a
distributed loop each rank trains only the micro-batches of `step.role(rank).pipeline`, with the TP/PP/CP degrees
that pipeline names.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

from tidal import Planner

VOCAB = 256


def data_loader(seed: int, tokens_per_step: int, max_len: int):
    """The loop's own loader: documents of long-tailed random lengths and random bytes, one step's worth at a time."""
    rng = np.random.default_rng(seed)
    while True:
        docs, total = [], 0
        while total < tokens_per_step:
            n = int(min(max_len, 1 + rng.lognormal(5.5, 1.3)))
            docs.append(torch.from_numpy(rng.integers(0, VOCAB, n + 1)))  # n + 1 tokens: n next-token targets
            total += n
        yield docs


class TinyLM(nn.Module):
    """A bigram language model: anything trainable on packed variable-length documents would do."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(VOCAB, dim), nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(tokens)))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="training steps")
    ap.add_argument("--cluster", default="cpux4", help="the cluster the plan is for (TYPExN)")
    ap.add_argument("--max-len", type=int, default=2048, help="longest document of a step")
    ap.add_argument("--tokens-per-step", type=int, default=8192, help="tokens per step")
    args = ap.parse_args(argv)
    torch.manual_seed(0)

    loader = data_loader(0, args.tokens_per_step, args.max_len)
    sample = [len(d) - 1 for _ in range(20) for d in next(data_loader(1, args.tokens_per_step, args.max_len))]
    planner = Planner("tiny", args.cluster, max_len=args.max_len, tokens_per_step=args.tokens_per_step,
                      sample_lengths=sample)
    print(f"candidates: {', '.join(planner.candidates)}")

    model = TinyLM()
    trained, losses = [], []
    for k in range(args.steps):
        docs = next(loader)
        step = planner.plan([len(d) - 1 for d in docs])
        tokens = sum(len(d) - 1 for d in docs)
        model.zero_grad()
        loss_sum, seen = 0.0, []
        for pipe in step.pipelines:  # a distributed loop: only pipe = step.pipelines[step.role(rank).pipeline]
            for mb in pipe.micro_batches:  # one packed varlen batch; documents never attend to each other
                loss = sum(nn.functional.cross_entropy(model(docs[i][:-1]), docs[i][1:], reduction="sum")
                           for i in mb.sequences) / tokens
                loss.backward()  # gradients accumulate over micro-batches (and over pipelines: the DP sum)
                loss_sum += float(loss.detach())
                seen += mb.sequences
        with torch.no_grad():  # plain SGD (any optimizer works: the plan only decides who trains what)
            for w in model.parameters():
                w -= 0.5 * w.grad
        assert sorted(seen) == list(range(len(docs))), "every document is trained exactly once"
        trained.append(len(seen))
        losses.append(loss_sum)
        mbs = sum(len(p.micro_batches) for p in step.pipelines)
        print(f"step {k + 1}: {len(docs)} documents, {tokens} tokens -> {step.strategy} "
              f"({len(step.pipelines)} pipelines, {mbs} micro-batches), est {step.est_step_time_s * 1e3:.1f} ms "
              f"(bound {step.lower_bound_s * 1e3:.1f} ms) | loss {loss_sum:.4f}")
    return {"losses": losses, "documents": trained, "candidates": planner.candidates}


if __name__ == "__main__":
    main()
