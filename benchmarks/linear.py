"""Skinny linear kernel vs F.linear on SmolLM2-135M's shapes, and the target pass with each.

    python benchmarks/linear.py [--repeats 21] [--threads 2]

Same as `specdec-fast linear-bench`; writes benchmarks/results/linear.{json,md}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["linear-bench", *sys.argv[1:]]))
