"""Cold vs warm first-request times, each in a fresh process.

    python benchmarks/warmup.py [--repeats 3] [--threads 2]

Same as `specdec-fast warmup-bench`; writes benchmarks/results/warmup.{json,md}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["warmup-bench", *sys.argv[1:]]))
