"""`tidal` console script: subcommands parse typed arguments and call library functions.

Errors from bad input (`TidalError`) print one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tidal import __version__
from tidal.core.errors import TidalError


def build_parser() -> argparse.ArgumentParser:
    from tidal.cli import checkpoint, demo, hf, plan, profile, report, simulate, train
    from tidal.cli import tokenizer as tokenizer_cli

    p = argparse.ArgumentParser(prog="tidal", description="Balance work, not tokens, in variable-length training.")
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TidalError as e:
        print(f"tidal {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tidal {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
