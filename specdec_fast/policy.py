"""Draft-length policies: after each draft token, CONTINUE drafting or STOP and verify.

A policy only chooses how many tokens to draft. It sees draft-side features and past
rounds, never the current round's target outputs, so it cannot bias the output.
"""

from __future__ import annotations

from typing import Protocol

from .reference.draft_step import DraftStepOutput


class DraftPolicy(Protocol):
    """The decoding loop calls, per round: ``max_draft_tokens`` once, ``continue_drafting``
    after each drafted token (not after the last allowed one), ``observe`` after verification."""

    def max_draft_tokens(self) -> int: ...

    def continue_drafting(self, position: int, step: DraftStepOutput) -> bool: ...

    def observe(self, drafted: int, accepted: int) -> None: ...


class FixedDraftLength:
    """Always draft ``k`` tokens (fewer only at the end of the token budget or at EOS)."""

    def __init__(self, k: int):
        if int(k) != k or k < 0:
            raise ValueError(f"num_draft_tokens must be an integer >= 0, got {k}")
        self.k = int(k)

    def max_draft_tokens(self) -> int:
        return self.k

    def continue_drafting(self, position: int, step: DraftStepOutput) -> bool:
        return True

    def observe(self, drafted: int, accepted: int) -> None:
        pass
