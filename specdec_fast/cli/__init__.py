"""The ``specdec-fast`` command line (entry point :func:`main`)."""

from .main import main

__all__ = ["main"]
