"""CP sharding modes and pipeline schedules on gloo ranks (one spawn of world 4 for all checks).

Micro-batches: documents shorter than 2*CP (3, 1, 2, 5 with CP=4), lengths that are not multiples of 2*CP
(13, 21, 9), a micro-batch of one document (37), one of 200 one-token documents, and single documents of 1 and 3
tokens, which leave some CP ranks without any token (they still join every collective).

Tolerance for per-doc vs per-seq: both runs compute the same function; only the partition of tokens over ranks (and so
the order in which per-token contributions are summed into weight gradients) differs, costing O(eps_fp32) per
reduction level, hence rtol 1e-5 as in test_parallel_equivalence. 1F1B vs GPipe must be *bitwise* identical: each stage
runs the same kernels on the same inputs and accumulates micro-batch gradients in the same order.
"""

import pytest

from tidal.runtime.launch import run_distributed

from _parallel_cases import PP_LENGTHS, PP_MBS  # isort: skip
from _parallel_cases import cp_modes_worker  # isort: skip

RTOL = 1e-5
pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def results():
    return run_distributed(cp_modes_worker, 4, timeout_s=300)


@pytest.mark.parametrize("cp", ["cp2", "cp4"])
def test_per_doc_and_per_seq_agree(results, cp):
    for r in results:
        x = r[cp]
        assert x["doc_vs_seq_grad"] <= RTOL, x["doc_vs_seq_grad"]
        assert x["doc_vs_seq_loss"] <= RTOL
        assert max(x["errs_doc"].values()) <= RTOL and max(x["errs_seq"].values()) <= RTOL
        assert x["loss_err_doc"] <= RTOL and x["loss_err_seq"] <= RTOL


def test_micro_batch_lengths_differ_30x():
    totals = [sum(PP_LENGTHS[j] for j in mb) for mb in PP_MBS]
    assert max(totals) >= 30 * min(totals)


def test_1f1b_and_gpipe_identical(results):
    for r in results:
        x = r["pp4"]
        assert x["identical"], x["max_abs_diff"]
        assert x["loss_1f1b"] == x["loss_gpipe"]
        assert max(x["errs"].values()) <= RTOL


def test_1f1b_peak_live_activations(results):
    """Measured by the executor: 1F1B stage s holds at most PP - s micro-batches, GPipe holds all of them."""
    pp, n = 4, len(PP_MBS)
    for r in results:
        x = r["pp4"]
        assert x["peak_live_1f1b"] <= pp
        assert x["peak_live_1f1b"] == min(pp - x["stage"], n)
        assert x["peak_live_gpipe"] == n
        assert x["peak_bytes_1f1b"] <= x["peak_bytes_gpipe"]


def test_bad_plans_raise_tidal_error(results):
    """Seven malformed plans: each raises TidalError with a one-line message on every rank, before communicating."""
    for r in results:
        assert len(r["errors"]) == 7, r["errors"]
        assert all("\n" not in m for m in r["errors"])


def test_gradient_independent_of_micro_batch_split(results):
    """Loss is normalised per token over the global batch: the 6-micro-batch pp4 run matches one process that packs all
    documents into a single micro-batch (same fp32 reordering argument, rtol 1e-5)."""
    for r in results:
        assert r["pp4"]["vs_one_micro_batch"] <= RTOL, r["pp4"]["vs_one_micro_batch"]
