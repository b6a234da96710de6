"""The draft with int8 weights (int8 skinny kernel, torchao, torch's dynamic quantization) against fp32: c, acceptance, tokens/s.

    pip install -e ".[quant]"
    python benchmarks/quant.py [--draft feature|token] [--prompts 8] [-k 1] [--threads 2]

Same as `specdec-fast quant-bench`; writes benchmarks/results/quant.{json,md,png}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["quant-bench", *sys.argv[1:]]))
