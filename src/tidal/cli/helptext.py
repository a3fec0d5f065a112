"""`--help` for every subcommand: defaults shown beside each flag and an example in the epilog; an unknown flag
is named with the closest known one (argparse would report a typo of a required flag as that flag missing)."""

from __future__ import annotations

import argparse

EXAMPLES = {
    "plan": "tidal plan --model llama2-7b --cluster a800x64 --data synthetic:commoncrawl --steps 5\n"
            "  tidal plan --config train.toml --train.steps 5 --data.max_len 4096    # dry-run a training job",
    "simulate": "tidal simulate --model llama2-13b --cluster a800x64 --systems tidal,hydraulis,megatron\n"
                "  tidal simulate --config train.toml --world.cluster a800x64 --report sim/    # dry-run a job",
    "train": "tidal train --config train.toml --nproc 4 --train.steps 5 --planner.strategies 'tp2+2*tp1'\n"
             "  torchrun --nproc-per-node 4 -m tidal train --config train.toml --data.max_len 4096",
    "verify": "tidal verify --nproc 4 --strategies 'tp4;2*tp2;4*tp1' --steps 3\n"
              "  tidal verify --nproc 2 --strategies auto --train.sequence_parallel true",
    "demo": "tidal demo --rounds 4 --memory-gib 0.2 --out tidal-demo",
    "profile": "tidal profile --model tiny --cluster cpux4 --out profile.json",
    "report": "tidal report calibration run.jsonl --cost-model analytic",
    "report calibration": "tidal report calibration run.jsonl --skip 2 --png calib.png",
    "tokenizer": "tidal tokenizer train --input jsonl:docs.jsonl --vocab 8192 --out tokenizer.json",
    "tokenizer train": "tidal tokenizer train --input jsonl:docs.jsonl --vocab 8192 --out tokenizer.json",
    "tokenizer index": "tidal tokenizer index --data jsonl:docs.jsonl --tokenizer tokenizer.json",
    "checkpoint": "tidal checkpoint inspect ckpt/",
    "checkpoint inspect": "tidal checkpoint inspect ckpt/step-000020 --json",
    "import": "tidal import hf ./Llama-3.2-1B --out ckpt/",
    "import hf": "tidal import hf ./Llama-3.2-1B --out ckpt/",
    "export": "tidal export hf ckpt/ --out ./exported",
    "export hf": "tidal export hf ckpt/ --out ./exported",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help (unless the help already says it, or the flag is a switch or has no
    default); descriptions and epilogs keep their line breaks."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if (action.option_strings and "%(default)" not in text and "default" not in text
                and d is not None and d is not False and d is not argparse.SUPPRESS and d != []):
            text += " (default: %(default)s)"
        return text


def subparsers(p: argparse.ArgumentParser):
    """(command path, parser) for every subcommand under `p`, depth first."""
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                path = f"{p.prog.split(' ', 1)[1]} {name}" if " " in p.prog else name
                yield path, sp
                yield from subparsers(sp)


def finish(p: argparse.ArgumentParser) -> None:
    """Every subcommand: defaults in --help, its example as the epilog, no abbreviated flags (`--conf` is not
    `--config`: with `--section.key` flags, abbreviations would silently pick one)."""
    for path, sp in subparsers(p):
        sp.formatter_class = HelpFormatter
        sp.allow_abbrev = False
        if sp.epilog is None and path in EXAMPLES:
            sp.epilog = "example:\n  " + EXAMPLES[path]


def unknown_flag(p: argparse.ArgumentParser, args) -> str | None:
    """The first argument in `args` that looks like a flag `p` does not know (before any `--`), or None."""
    known = p._option_string_actions
    for a in args:
        if a == "--":
            return None
        if not a.startswith("-") or a == "-" or " " in a or p._negative_number_matcher.match(a):
            continue
        flag = a.split("=", 1)[0]
        if flag not in known and (flag.startswith("--") or len(flag) == 2):
            return flag
    return None
