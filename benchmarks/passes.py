"""The target's own pass: transformers, skinny + packed GQA, the lean path, llama.cpp (optional).

    python benchmarks/passes.py [--repeats 15] [--prompts 3] [--threads 2]

Same as `specdec-fast pass-bench`; writes benchmarks/results/passes.{json,md,png}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["pass-bench", *sys.argv[1:]]))
