"""Feature-draft files side by side on the held-out prompts: cost c, teacher-forced top-1 / top-3 agreement,
acceptance by position.

    python benchmarks/drafts.py OLD.safetensors NEW.safetensors [--prompts 34] [-k 2] [--threads 2]

Same as `specdec-fast draft-bench`; writes benchmarks/results/drafts.{json,md}.
"""

import sys

from specdec_fast.cli import main

if __name__ == "__main__":
    sys.exit(main(["draft-bench", *sys.argv[1:]]))
