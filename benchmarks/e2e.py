"""End-to-end benchmark: target alone vs transformers assisted generation vs fast_generate.

    python benchmarks/e2e.py [--prompts N] [--lengths 1 2 ...] [--temperatures 0 1]

Same as `specdec-fast bench`; writes benchmarks/results/e2e.{json,md,png}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
