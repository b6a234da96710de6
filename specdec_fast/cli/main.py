"""The command line: ``specdec-fast generate --prompt "..."`` and the training and benchmark commands."""

from __future__ import annotations

import argparse
import sys

import torch

from . import bench, generate, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-fast", description="Lossless speculative decoding.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    commands = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(commands, common)
    bench.add_parsers(commands, common)
    train.add_parsers(commands, common)

    args = parser.parse_args(argv)
    argv = argv if argv is not None else sys.argv[1:]
    args.argv = argv[argv.index(args.command) + 1 :]  # what followed the subcommand
    if args.threads:
        torch.set_num_threads(args.threads)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
