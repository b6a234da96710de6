"""Pure-torch references: the executable specification every kernel is tested against."""

from .draft_step import draft_step_reference
from .verify import verify_reference
from .verify_block import verify_block_reference

__all__ = ["draft_step_reference", "verify_block_reference", "verify_reference"]
