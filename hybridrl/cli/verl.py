"""The CLI's door for verl's command lines (`python -m hybridrl.main_ppo | main_dapo | sft_trainer`):
the argv is translated by the compatibility wing (hybridrl/compat/verl/argv.py) and run as `hybridrl train`."""

from __future__ import annotations

import sys

from hybridrl.compat.verl.argv import ArgvError, train_args, usage


def main(entry: str, argv: list[str] | None = None) -> int:
    from hybridrl.cli.main import main as hybridrl_main

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage(entry))
        return 0
    try:
        args = train_args(entry, argv)
    except ArgvError as e:
        print(f"hybridrl: error: {e}", file=sys.stderr)
        return 2
    return hybridrl_main(args)
