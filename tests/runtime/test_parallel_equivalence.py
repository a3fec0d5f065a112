"""Numerical equivalence of every parallel scheme with one process, on gloo ranks.

Tolerance: fp32, rtol 1e-5 on the loss and on every parameter gradient, measured as
max|g - g_ref| / max|g_ref| per parameter (TP shards compared with the matching slice of the reference). The parallel
run performs the same arithmetic as the single process except for the *order* of some sums: TP row-parallel layers
and the vocab-parallel softmax add partial sums across ranks, CP and PP sum per-rank gradient contributions, and the
all-reduce tree adds in yet another order. Each reordering costs O(eps_fp32 = 6e-8) relative error per addition
level; over the few levels in a 4-6 layer model the observed worst case is < 1e-6, so 1e-5 leaves 10x margin while
any real bug (a wrong mask, a missing reduction, a dropped token) produces errors of order 1e-2..1.
Scaling by the tensor's max |g_ref| instead of elementwise avoids dividing by gradient entries that cancel to ~0.
"""

import pytest

from tidal.runtime.launch import run_distributed

from _parallel_cases import EQ_CASES, accumulate_worker, equivalence_worker, world8_worker  # isort: skip

RTOL = 1e-5
pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def results():
    """One spawn of world 4 runs every case in turn (several spawns would cost more than the cases themselves)."""
    per_rank = run_distributed(equivalence_worker, 4, timeout_s=300)
    out: dict[str, list[dict]] = {}
    for d in per_rank:
        for name, r in d.items():
            out.setdefault(name, []).append(r)
    return out


@pytest.mark.parametrize("case", [c[0] for c in EQ_CASES])
def test_scheme_matches_single_process(results, case):
    """Loss and every parameter gradient within rtol 1e-5 of the one-process run (see the module docstring)."""
    ranks = results[case]
    assert ranks, f"no rank ran {case}"
    for r in ranks:
        assert r["loss_rel_err"] <= RTOL, (case, r["scheme"], r["loss"], r["ref_loss"])
        worst = max(r["errs"], key=r["errs"].get)
        assert r["errs"][worst] <= RTOL, (case, r["scheme"], worst, r["errs"][worst])


@pytest.mark.parametrize("case", [c[0] for c in EQ_CASES])
def test_every_parameter_is_covered(results, case):
    """Each pipeline's ranks together hold a gradient for every parameter of the full model (tied tables count once)."""
    by_scheme: dict[str, set] = {}
    ref = {}
    for r in results[case]:
        names = {"tok_embeddings.weight" if n == "output.weight" and "output.weight" not in r["ref_names"] else n
                 for n in r["names"]}
        by_scheme.setdefault(r["scheme"], set()).update(names)
        ref[r["scheme"]] = set(r["ref_names"])
    for scheme, names in by_scheme.items():
        assert names == ref[scheme], (case, scheme, ref[scheme] ^ names)


def test_world8_tp2pp2cp2():
    """All three kinds of parallelism at once on 8 ranks (mixed per-doc / per-seq micro-batches); same tolerance."""
    for r in run_distributed(world8_worker, 8, timeout_s=300):
        assert r["loss_rel_err"] <= RTOL
        assert max(r["errs"].values()) <= RTOL, r["errs"]


def test_gradient_accumulation_across_calls_is_exact():
    """Two run_pipeline calls without zeroing = one call over all micro-batches (before the fix, CP and tied-embedding
    replicas re-summed what the first call had accumulated: 3x instead of 2x at cp2)."""
    for r in run_distributed(accumulate_worker, 4, timeout_s=300):
        assert r["max_rel"] <= RTOL, r
