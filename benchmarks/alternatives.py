"""First-token alternatives against the same loop without them, paired per prompt (feature draft:
fixed draft lengths and the shipped learned policy).

    python benchmarks/alternatives.py [--prompts 12] [--lengths 1 2] [--alternatives 3] [--threads 2]

Same as `specdec-fast alternatives-bench`; writes benchmarks/results/alternatives.{json,md}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["alternatives-bench", *sys.argv[1:]]))
