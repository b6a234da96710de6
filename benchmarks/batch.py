"""Batched speculative decoding vs batched autoregressive decoding at B = 1, 2, 4, 8, 16.

    python benchmarks/batch.py [--draft feature|token] [--batches 1 2 4 8 16] [--lengths 1 2 4] [--repeats 3] [--threads 2]

Same as `specdec-fast batch-bench`; writes benchmarks/results/batch_<draft>.{json,md,png}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["batch-bench", *sys.argv[1:]]))
