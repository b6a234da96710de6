"""Verify-kernel microbenchmark: every backend vs the torch reference and transformers.

    python benchmarks/microbench.py [--batches 1 8 32 128] [--lengths 1 4 8] [--vocabs ...] [--dtypes float32 bfloat16]

Same as `specdec-fast microbench`; writes benchmarks/results/microbench.{json,md}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["microbench", *sys.argv[1:]]))
