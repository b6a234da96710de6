"""Where specdec_fast keeps what it makes on a user's machine (never inside the package)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The user cache folder: ``$SPECDEC_FAST_CACHE``, else ``$XDG_CACHE_HOME/specdec_fast``, else
    ``~/.cache/specdec_fast``. Kernel builds and the converted SmolLM2 checkpoint live here."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec_fast"
    return Path(os.environ.get("SPECDEC_FAST_CACHE", default))
