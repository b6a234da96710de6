"""The command line: ``specdec-fast generate --prompt "..."`` and the training and benchmark commands.

A user error is one line on stderr and exit status 2, found before any model loads where the
flags alone tell (``SPECDEC_FAST_VERBOSE=1`` shows the traceback of one found later).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from . import bench, calibrate, generate, train


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``specdec-fast generate: error: ...``."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="specdec-fast", description="Lossless speculative decoding.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's choice)")
    commands = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(commands, common)
    calibrate.add_parser(commands, common)
    bench.add_parsers(commands, common)
    train.add_parsers(commands, common)
    for sub in commands.choices.values():
        sub.formatter_class = argparse.ArgumentDefaultsHelpFormatter
        sub.set_defaults(parser=sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    argv = argv if argv is not None else sys.argv[1:]
    args.argv = argv[argv.index(args.command) + 1 :]  # what followed the subcommand
    if args.threads < 0:
        args.parser.error(f"--threads must be >= 0, got {args.threads}")
    if hasattr(args, "check"):
        args.check(args.parser, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return args.run(args)
    except (ValueError, OSError, ImportError) as error:  # found after loading: still one line
        if os.environ.get("SPECDEC_FAST_VERBOSE"):
            raise
        sys.stderr.write(f"{args.parser.prog}: error: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
