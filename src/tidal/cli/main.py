"""`tidal` console script: subcommands parse typed arguments and call library functions.

Every failure is one line on stderr with a documented exit code (core/errors.py EXIT_CODES, docs/training.md):
bad input (`TidalError`, an unreadable file) exits 2 before any rank starts; a run that started and failed
(`RunFailure`: a rank raised or died, a collective timeout, non-finite steps, a signal) exits with its own code, its
traceback written to a file the line names; anything else is a bug: one line, exit 70, the traceback in a file.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Sequence

from tidal import __version__
from tidal.core.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_SIGINT, EXIT_SIGTERM, RunFailure, TidalError, did_you_mean


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2, like every other bad input); an unknown flag is named first,
    with the closest known one (a typo of a required flag is not reported as that flag missing)."""

    def parse_known_args(self, args=None, namespace=None):
        from tidal.cli.helptext import unknown_flag

        if args is not None and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            flag = unknown_flag(self, args)
            if flag is not None:
                known = [s for s in self._option_string_actions if s.startswith("--")]
                self.error(f"unknown flag {flag}{did_you_mean(flag, known)}")
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:  # a mistyped subcommand: name the closest
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        self.exit(EXIT_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from tidal.cli import checkpoint, demo, helptext, hf, plan, profile, report, simulate, train
    from tidal.cli import tokenizer as tokenizer_cli

    p = OneLineParser(prog="tidal", description="Balance work, not tokens, in variable-length training.")
    p.add_argument("--version", action="version", version=f"tidal {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    plan.add_parser(sub)
    simulate.add_parser(sub)
    train.add_parsers(sub)
    demo.add_parser(sub)
    profile.add_parser(sub)
    report.add_parser(sub)
    tokenizer_cli.add_parser(sub)
    checkpoint.add_parser(sub)
    hf.add_parsers(sub)
    helptext.finish(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TidalError as e:
        print(f"tidal {args.command}: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_INPUT
    except RunFailure as e:
        where = _keep(e.detail, args.command)
        stopped = e.exit_code in (EXIT_SIGINT, EXIT_SIGTERM) and not e.detail
        print(f"tidal {args.command}: {'' if stopped else 'error: '}{e.line}{where}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"tidal {args.command}: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except OSError as e:  # a file that cannot be read or written (a full disk, a directory given for a file)
        name = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"tidal {args.command}: error: {name}{e.strerror or e}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback kept in a file
        where = _keep(traceback.format_exc(), args.command)
        print(f"tidal {args.command}: internal error: {type(e).__name__}: {_one_line(str(e))}{where}",
              file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _keep(detail: str, command: str) -> str:
    """Write a traceback to a temporary file; returns ' (traceback: PATH)' or ''."""
    if not detail:
        return ""
    try:
        fd, path = tempfile.mkstemp(prefix=f"tidal-{command}-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(detail)
    except OSError:
        return ""
    return f" (traceback: {path})"


def entry() -> None:
    """The console script: `main`, then leave at once. Everything is written and flushed by then; the interpreter's
    own shutdown (finalisers of torch objects) takes seconds on a loaded machine and would keep a stopped run's
    launcher alive for nothing (decision 80)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
