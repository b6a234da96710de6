"""Soak run: 1,000 rounds of fast_generate and of batch_generate on the default pair, RSS after warm-up and every 100 rounds.

    python benchmarks/soak.py [--rounds 1000] [--threads 2]

Same as `specdec-fast soak`; writes benchmarks/results/soak.{json,md}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["soak", *sys.argv[1:]]))
