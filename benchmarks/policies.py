"""Draft-length policies x verifiers on the held-out prompts (the MDP evaluation).

    python benchmarks/policies.py [--prompts 6] [--temperatures 0 1] [--max-new-tokens 64] [--lengths 1 2 3 4 6] [--draft feature|token]

Same as `specdec-fast policies`; writes benchmarks/results/policies_{draft}.{json,md,png}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["policies", *sys.argv[1:]]))
