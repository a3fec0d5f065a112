"""The exception types user-facing code raises, and the exit codes `tidal` ends with (docs/training.md, "Exit codes").

`TidalError` is bad input: the CLI prints it as a single line and exits 2, before any rank starts. The run failures
below happen after ranks started; each carries its exit code and a one-line message naming what failed (rank, step,
operation, file); the longer detail (a rank's traceback) is kept in ``.detail`` and written to a file by the CLI.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_VERIFY = 1  # `tidal verify`: the distributed run differs from one process beyond the tolerance
EXIT_INPUT = 2  # bad input (config, data, tokenizer, cost model, checkpoint, argument): refused before ranks start
EXIT_RANK = 3  # a rank raised or died after start-up
EXIT_NONFINITE = 4  # max_consecutive_skips non-finite steps in a row (or non-finite state at a checkpoint)
EXIT_TIMEOUT = 5  # a rank did not arrive at a collective within the collective timeout (or the optional deadline)
EXIT_INTERNAL = 70  # an unexpected error (a bug): one line, the traceback written to a file
EXIT_SIGINT = 130  # stopped by SIGINT (128 + 2): checkpoint saved at the next step boundary where possible
EXIT_SIGTERM = 143  # stopped by SIGTERM (128 + 15): the same

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_VERIFY: "verify mismatch",
    EXIT_INPUT: "bad input, refused before any rank starts",
    EXIT_RANK: "a rank failed",
    EXIT_NONFINITE: "too many non-finite steps in a row",
    EXIT_TIMEOUT: "a rank did not arrive at a collective in time",
    EXIT_INTERNAL: "internal error (a bug)",
    EXIT_SIGINT: "interrupted (SIGINT)",
    EXIT_SIGTERM: "terminated (SIGTERM)",
}


class TidalError(ValueError):
    """Bad input or an impossible configuration. The message is one line and says what to change."""

    exit_code = EXIT_INPUT


class RunFailure(RuntimeError):
    """A run that started failed. `str()` is the whole story (with the rank's traceback, for tests and logs); `line`
    is the one line the CLI prints; `exit_code` is documented in EXIT_CODES."""

    exit_code = EXIT_RANK

    def __init__(self, line: str, detail: str = "", exit_code: int | None = None) -> None:
        super().__init__(line + (f"\n{detail}" if detail else ""))
        self.line = " ".join(line.split())
        self.detail = detail
        if exit_code is not None:
            self.exit_code = exit_code


def did_you_mean(word: str, choices, *, prefix: str = "") -> str:
    """'; did you mean X?' for the closest of `choices` to `word` (difflib), else ''. `prefix` is put before the
    suggestion (e.g. '--' for a flag)."""
    import difflib

    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""
