"""Worker bodies for the distributed runtime tests (run in spawned gloo ranks by tidal.runtime.launch).

Each case runs one or more pipelines side by side on disjoint ranks of the world, computes the single-process
reference on the same packed micro-batches inside every rank (cheap for the tiny model), and returns per-parameter
errors of this rank's gradient shards, so the parent only aggregates.
"""

from __future__ import annotations

import dataclasses

import torch

from tidal.core import ModelSpec, ParallelScheme, PipelinePlan, get_model
from tidal.core.strategy import Pipeline
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.runtime.pipeline import GroupCache, RankGrid, build_stage_model, run_pipeline
from tidal.runtime.tp import tp_shard_dims

TINY = get_model("tiny")
TINY_TIED = dataclasses.replace(TINY, name="tiny-tied", tie_embeddings=True)


def make_documents(seq_lengths, vocab: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n + 1,), generator=g) for n in seq_lengths]


def reference_grads(spec: ModelSpec, seq_lengths, documents, micro_batches, norm: float, seed: int = 0):
    """One process, no parallelism: same packed micro-batches, loss = sum CE / norm accumulated over them."""
    torch.manual_seed(seed)
    model = Llama(spec, "sdpa")
    total = 0.0
    for mb in micro_batches:
        lens = [seq_lengths[j] for j in mb]
        x = torch.cat([documents[j][:-1] for j in mb])
        y = torch.cat([documents[j][1:] for j in mb])
        loss = loss_sum(model(x, VarlenBatch.from_lengths(lens)), y) / norm
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _slice(ref: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    return ref if dim is None or size == 1 else ref.chunk(size, dim=dim)[rank]


def run_case(rank: int, pipelines: list[tuple[ParallelScheme, tuple[int, ...], ModelSpec]], seq_lengths,
             micro_batches, cp_sharding=(), schedule="1f1b", extra_tokens: int = 0, groups: GroupCache | None = None,
             compare: bool = True, tp_options: dict | None = None) -> dict | None:
    """Run one case on this rank (a rank in no pipeline returns None): every pipeline (scheme, devices, model) runs
    the same micro-batches. Returns loss, per-parameter errors against the one-process reference, and grads."""
    torch.set_num_threads(1)  # several ranks share 2 cores: OpenMP spinning across processes is very slow
    groups = (groups if groups is not None else GroupCache()).create_all([Pipeline(s, d) for s, d, _ in pipelines])
    mine = [p for p in pipelines if rank in p[1]]
    if not mine:
        return None
    scheme, devices, spec = mine[0]
    documents = make_documents(seq_lengths, spec.vocab, seed=1)
    grid = RankGrid.build(Pipeline(scheme, devices), rank, groups)
    model = build_stage_model(spec, grid, seed=0, attn_backend="sdpa", **(tp_options or {}))
    tokens = sum(seq_lengths[j] for mb in micro_batches for j in mb)
    norm = tokens + extra_tokens
    plan = PipelinePlan(scheme.tp, scheme.pp, scheme.cp, devices, max(seq_lengths), tuple(micro_batches), 0.0,
                        tuple(cp_sharding) if scheme.cp > 1 else (), scheme.layer_split)
    res = run_pipeline(model, grid, plan, seq_lengths, documents, global_tokens=norm, schedule=schedule)
    assert res.device_seconds is None  # the CPU records no CUDA events (compute time is thread CPU time)
    dims = tp_shard_dims(model)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    out = {"scheme": str(scheme), "stage": grid.stage, "cp_rank": grid.cp_rank, "tp_rank": grid.tp_rank,
           "loss": res.loss, "peak_live": res.peak_live_micro_batches, "peak_bytes": res.peak_saved_bytes,
           "grads": grads, "names": sorted(grads)}
    if compare:
        ref_loss, ref = reference_grads(spec, seq_lengths, documents, micro_batches, norm)
        errs = {}
        for n, g in grads.items():
            dim = dims.get(n)
            if spec.tie_embeddings and n == "output.weight":  # the last stage's copy of the tied table
                n = "tok_embeddings.weight"
            r = _slice(ref[n], dim, grid.tp_rank, scheme.tp)
            if r.shape != g.shape:
                raise AssertionError(f"{n}: shard shape {tuple(g.shape)} vs reference slice {tuple(r.shape)}")
            errs[n] = max(errs.get(n, 0.0), float((g - r).abs().max() / ref[n].abs().max()))
        out.update(ref_loss=ref_loss, loss_rel_err=abs(res.loss - ref_loss) / abs(ref_loss), errs=errs,
                   ref_names=sorted(ref))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Worker entry points (module-level so spawn can pickle them).

EQ_LENGTHS = (7, 3, 12, 1, 5, 9, 2, 16, 11)
EQ_MBS = ((0, 1, 2), (3, 4), (5, 6, 7), (8,))
EQ_MODES = ("per-doc", "per-seq", "per-doc", "per-seq")

# name -> pipelines (scheme, devices, model) over world 4; pipelines of one case run side by side
EQ_CASES = (
    ("tp2 | pp2[2,4]",
     [(ParallelScheme(tp=2), (0, 1), TINY), (ParallelScheme(pp=2, layer_split=(2, 4)), (2, 3), TINY)]),
    ("cp2 | pp2 tied", [(ParallelScheme(cp=2), (0, 1), TINY), (ParallelScheme(pp=2), (2, 3), TINY_TIED)]),
    ("tp4", [(ParallelScheme(tp=4), (0, 1, 2, 3), TINY)]),
    ("pp4[2,1,1,2]", [(ParallelScheme(pp=4, layer_split=(2, 1, 1, 2)), (0, 1, 2, 3), TINY)]),
    ("cp4", [(ParallelScheme(cp=4), (0, 1, 2, 3), TINY)]),
    ("tp2pp2[4,2]", [(ParallelScheme(tp=2, pp=2, layer_split=(4, 2)), (0, 1, 2, 3), TINY)]),
    ("tp2cp2", [(ParallelScheme(tp=2, cp=2), (0, 1, 2, 3), TINY)]),
    ("pp2cp2[2,4]", [(ParallelScheme(pp=2, cp=2, layer_split=(2, 4)), (0, 1, 2, 3), TINY)]),
    ("tp2 tied | cp2 tied", [(ParallelScheme(tp=2), (0, 1), TINY_TIED), (ParallelScheme(cp=2), (2, 3), TINY_TIED)]),
    # device lists that are not ascending, as place() produces (tp1+tp4cp2 on h20x12 gives (8,9,10,11,0,1,2,3)):
    # torch orders a group by global rank, the layout does not; TP shards and CP rows must follow the layout
    ("tp2 (1,0) | cp2 (3,2)", [(ParallelScheme(tp=2), (1, 0), TINY), (ParallelScheme(cp=2), (3, 2), TINY)]),
    ("tp2cp2 (3,1,2,0)", [(ParallelScheme(tp=2, cp=2), (3, 1, 2, 0), TINY_TIED)]),
    ("pp2cp2 (2,3,1,0) tied", [(ParallelScheme(pp=2, cp=2), (2, 3, 1, 0), TINY_TIED)]),
)


def equivalence_worker(rank: int, world: int) -> dict:
    """All numerical-equivalence schemes in one spawn of world 4. Returns {case: this rank's result, no grads}."""
    groups = GroupCache()
    out = {}
    for name, pipes in EQ_CASES:
        r = run_case(rank, pipes, EQ_LENGTHS, EQ_MBS, EQ_MODES, extra_tokens=17, groups=groups)
        if r is not None:
            r.pop("grads")
            out[name] = r
    return out


CP_LENGTHS = (3, 1, 2, 5, 13, 21, 9, 37) + (1,) * 200
CP_MBS = ((0, 1, 2, 3), (4, 5, 6), (7,), tuple(range(8, 208)), (1,), (0,))  # last two leave CP ranks empty


def _max_rel_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max()) for n in b)


def cp_modes_worker(rank: int, world: int) -> dict:
    """Per-doc vs per-seq CP on cp2 (two pipelines at once) and cp4, on short, non-multiple, single-document and
    200-one-token-document micro-batches; plus 1F1B vs GPipe on pp4 micro-batches of 3 to 90 tokens.
    Gradients are compared here (same rank, same coordinates) and dropped before returning."""
    groups = GroupCache()
    out = {}
    n = len(CP_MBS)
    for cp, pipes in ((2, [(ParallelScheme(cp=2), (0, 1), TINY), (ParallelScheme(cp=2), (2, 3), TINY)]),
                      (4, [(ParallelScheme(cp=4), (0, 1, 2, 3), TINY)])):
        runs = {mode: run_case(rank, pipes, CP_LENGTHS, CP_MBS, (mode,) * n, groups=groups)
                for mode in ("per-doc", "per-seq")}
        doc, seq = runs["per-doc"], runs["per-seq"]
        out[f"cp{cp}"] = {"doc_vs_seq_grad": _max_rel_diff(doc["grads"], seq["grads"]),
                          "doc_vs_seq_loss": abs(doc["loss"] - seq["loss"]) / abs(seq["loss"]),
                          "errs_doc": doc["errs"], "errs_seq": seq["errs"],
                          "loss_err_doc": doc["loss_rel_err"], "loss_err_seq": seq["loss_rel_err"]}
    out["errors"] = bad_plan_errors(rank, groups)
    pipes = [(ParallelScheme(pp=4, layer_split=(1, 2, 2, 1)), (0, 1, 2, 3), TINY)]
    runs = {s: run_case(rank, pipes, PP_LENGTHS, PP_MBS, schedule=s, groups=groups, compare=s == "1f1b")
            for s in ("1f1b", "gpipe")}
    a, b = runs["1f1b"], runs["gpipe"]
    # the same documents as ONE micro-batch, one process: the per-token global normalisation makes it the same gradient
    everything = (tuple(j for mb in PP_MBS for j in mb),)
    _, one = reference_grads(TINY, PP_LENGTHS, make_documents(PP_LENGTHS, TINY.vocab, seed=1), everything,
                             sum(PP_LENGTHS[j] for j in everything[0]))
    out["pp4"] = {"stage": a["stage"], "identical": all(torch.equal(a["grads"][k], b["grads"][k]) for k in a["grads"]),
                  "max_abs_diff": max(float((a["grads"][k] - b["grads"][k]).abs().max()) for k in a["grads"]),
                  "loss_1f1b": a["loss"], "loss_gpipe": b["loss"], "errs": a["errs"],
                  "peak_live_1f1b": a["peak_live"], "peak_live_gpipe": b["peak_live"],
                  "peak_bytes_1f1b": a["peak_bytes"], "peak_bytes_gpipe": b["peak_bytes"],
                  "vs_one_micro_batch": max(float((g - one[k]).abs().max() / one[k].abs().max())
                                            for k, g in a["grads"].items())}
    return out


def bad_plan_errors(rank: int, groups: GroupCache) -> list[str]:
    """Bad plans must raise TidalError before any communication (so no rank hangs); returns the messages."""
    from tidal.core import TidalError

    scheme = ParallelScheme(cp=4)
    pipeline = Pipeline(scheme, (0, 1, 2, 3))
    grid = RankGrid.build(pipeline, rank, groups.create_all([pipeline]))
    model = build_stage_model(TINY, grid)
    lengths = (4, 5)
    docs = make_documents(lengths, TINY.vocab, 0)

    def plan(mbs, modes, tp=1, cp=4):
        return PipelinePlan(tp, 1, cp, (0, 1, 2, 3), 5, mbs, 0.0, modes)

    bad = [
        (plan(((0, 2),), ("per-doc",)), lengths, docs, "1f1b"),  # index out of range
        (plan(((0, 1),), ()), lengths, docs, "1f1b"),  # CP modes missing
        (plan(((0, 1),), ("zigzag",)), lengths, docs, "1f1b"),  # unknown mode
        (plan(((0, 1),), ("per-doc",), tp=2, cp=2), lengths, docs, "1f1b"),  # plan for another scheme
        (plan(((0, 1),), ("per-doc",)), (4, 6), docs, "1f1b"),  # documents do not match lengths
        (plan(((0, 1),), ("per-doc",)), lengths, docs, "interleaved"),  # unknown schedule
        (plan(((),), ("per-doc",)), lengths, docs, "1f1b"),  # empty micro-batch
    ]
    msgs = []
    for p, lens, d, sched in bad:
        try:
            run_pipeline(model, grid, p, lens, d, schedule=sched)
        except TidalError as e:
            msgs.append(str(e))
    return msgs


PP_LENGTHS = (3, 90, 40, 50, 2, 1, 30, 30, 30, 7)
PP_MBS = ((0,), (1,), (2, 3), (4, 5), (6, 7, 8), (9,))  # totals 3, 90, 90, 3, 90, 7: a 30x spread


def world8_worker(rank: int, world: int) -> dict:
    """tp2pp2cp2 on 8 ranks, both CP modes in turn."""
    groups = GroupCache()
    scheme = ParallelScheme(tp=2, pp=2, cp=2, layer_split=(4, 2))
    r = run_case(rank, [(scheme, tuple(range(8)), TINY)], EQ_LENGTHS, EQ_MBS, EQ_MODES, extra_tokens=5, groups=groups)
    r.pop("grads")
    return r


def accumulate_worker(rank: int, world: int) -> dict:
    """run_pipeline twice without zeroing equals one call over both halves of the micro-batches (cp2 and a tied
    pp2 pipeline, whose replica all-reduces must sum only each call's own contribution)."""
    groups = GroupCache()
    pipes = [(ParallelScheme(cp=2), (1, 0), TINY), (ParallelScheme(pp=2), (2, 3), TINY_TIED)]
    groups.create_all([Pipeline(s, d) for s, d, _ in pipes])
    scheme, devices, spec = next(p for p in pipes if rank in p[1])
    grid = RankGrid.build(Pipeline(scheme, devices), rank, groups)
    docs = make_documents(EQ_LENGTHS, spec.vocab, seed=1)
    norm = sum(EQ_LENGTHS)

    def plan(mbs):
        return PipelinePlan(scheme.tp, scheme.pp, scheme.cp, devices, 16, mbs, 0.0,
                            tuple(EQ_MODES[: len(mbs)]) if scheme.cp > 1 else (), scheme.layer_split)

    once = build_stage_model(spec, grid, seed=0, attn_backend="sdpa")
    run_pipeline(once, grid, plan(EQ_MBS), EQ_LENGTHS, docs, global_tokens=norm)
    twice = build_stage_model(spec, grid, seed=0, attn_backend="sdpa")
    run_pipeline(twice, grid, plan(EQ_MBS[:2]), EQ_LENGTHS, docs, global_tokens=norm)
    run_pipeline(twice, grid, plan(EQ_MBS[2:]), EQ_LENGTHS, docs, global_tokens=norm)
    a = {n: p.grad for n, p in once.named_parameters()}
    b = {n: p.grad for n, p in twice.named_parameters()}
    return {"scheme": str(scheme), "max_rel": _max_rel_diff(b, a)}
