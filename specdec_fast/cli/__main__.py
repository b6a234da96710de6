"""``python -m specdec_fast.cli``: the specdec-fast command."""

import sys

from .main import main

sys.exit(main())
