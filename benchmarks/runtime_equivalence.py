"""Print the numerical-equivalence figures of issue 4 (docs/runtime.md): every parallel scheme vs one process,
per-doc vs per-seq CP, 1F1B vs GPipe with measured peak live activations. Runs the same workers as tests/runtime on
gloo ranks (about a minute on 2 cores).

    python benchmarks/runtime_equivalence.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from _parallel_cases import cp_modes_worker, equivalence_worker, world8_worker  # noqa: E402

from tidal.runtime.launch import run_distributed  # noqa: E402


def main() -> None:
    print("scheme equivalence vs one process (fp32; max over ranks; limit 1e-5)")
    print(f"{'case':<22} {'scheme':<16} {'loss rel err':>13} {'max grad rel err':>17}")
    rows: dict[tuple[str, str], list[float]] = {}
    for per_rank in run_distributed(equivalence_worker, 4, timeout_s=600):
        for case, r in per_rank.items():
            cur = rows.setdefault((case, r["scheme"]), [0.0, 0.0])
            cur[0] = max(cur[0], r["loss_rel_err"])
            cur[1] = max(cur[1], max(r["errs"].values()))
    for r in run_distributed(world8_worker, 8, timeout_s=600):
        cur = rows.setdefault(("world 8", r["scheme"]), [0.0, 0.0])
        cur[0], cur[1] = max(cur[0], r["loss_rel_err"]), max(cur[1], max(r["errs"].values()))
    for (case, scheme), (le, ge) in rows.items():
        print(f"{case:<22} {scheme:<16} {le:>13.1e} {ge:>17.1e}")

    res = run_distributed(cp_modes_worker, 4, timeout_s=600)
    print("\nper-doc vs per-seq CP (short docs, non-multiples of 2CP, one doc, 200 one-token docs, empty ranks)")
    for cp in ("cp2", "cp4"):
        g = max(r[cp]["doc_vs_seq_grad"] for r in res)
        lo = max(r[cp]["doc_vs_seq_loss"] for r in res)
        ref = max(max(r[cp]["errs_doc"].values()) for r in res)
        print(f"  {cp}: grad rel diff {g:.1e}, loss rel diff {lo:.1e}, per-doc vs reference {ref:.1e}")
    print("\n1F1B vs GPipe, pp4[1,2,2,1], micro-batches of 3/90/90/3/90/7 tokens (30x spread)")
    print(f"{'stage':>5} {'identical':>9} {'max abs diff':>12} {'live 1F1B':>9} {'live GPipe':>10} "
          f"{'bytes 1F1B':>11} {'bytes GPipe':>11} {'vs one mb':>9}")
    for r in sorted((r["pp4"] for r in res), key=lambda r: r["stage"]):
        print(f"{r['stage']:>5} {str(r['identical']):>9} {r['max_abs_diff']:>12.1e} {r['peak_live_1f1b']:>9} "
              f"{r['peak_live_gpipe']:>10} {r['peak_bytes_1f1b']:>11,} {r['peak_bytes_gpipe']:>11,} "
              f"{r['vs_one_micro_batch']:>9.1e}")


if __name__ == "__main__":
    main()
