"""One plain line per training step, for output that is not a terminal (a log file, torchrun, a SLURM job), where a
progress bar shows nothing until the end (issue 26 item 3)::

    step 3/20 | loss 5.4321 | 12,345 tok/s | tp2+2*tp1 | mem 1.23 GiB | 0.52 s

`mem` is rank 0's peak: CUDA's ``max_memory_allocated`` on a GPU, the process's peak resident set size on a CPU.
"""

from __future__ import annotations

import resource
import sys


def peak_memory_bytes() -> int:
    """This process's peak memory: allocated CUDA memory when CUDA is initialised, else the peak RSS (Linux KiB)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def step_line(row: dict, total: int, mem_bytes: int) -> str:
    return (f"step {row['step'] + 1}/{total} | loss {row['loss']:.4f} | {row['tokens_per_s']:,.0f} tok/s | "
            f"{row['strategy']} | mem {mem_bytes / 2**30:.2f} GiB | {row['wall_s']:.2f} s")


def plain_output(stream=None) -> bool:
    """True when `stream` (stdout) is not a terminal."""
    s = sys.stdout if stream is None else stream
    return not (hasattr(s, "isatty") and s.isatty())


def printer(total: int, stream=None):
    """An `on_step` callback that prints one flushed line per step to `stream` (stdout)."""

    def on_step(row: dict) -> None:
        print(step_line(row, total, peak_memory_bytes()), file=stream or sys.stdout, flush=True)

    return on_step
