"""Baseline draft-length policies: a fixed length, transformers' heuristic schedule, and two
training-free stopping rules (draft confidence, entropy)."""

from __future__ import annotations

import math

from .mdp import MDPState, SpeculativePolicy


class FixedDraftLength(SpeculativePolicy):
    """Always draft ``k`` tokens (fewer only at the end of the token budget or at EOS)."""

    def __init__(self, k: int):
        if int(k) != k or k < 0:
            raise ValueError(f"num_draft_tokens must be an integer >= 0, got {k}")
        super().__init__(k)
        self.k = self.max_length


class HeuristicSchedule(SpeculativePolicy):
    """transformers' "heuristic" schedule: +2 tokens after a fully accepted round, -1 otherwise (>= 1)."""

    def __init__(self, start: int = 5, max_draft_tokens: int = 16):
        super().__init__(max_draft_tokens)
        self.length = start

    def begin_round(self, remaining: int, rows: int | None = None) -> int:
        super().begin_round(remaining)
        return min(self.length, remaining)

    def observe(self, drafted: int, accepted: float, draft_s: float, target_s: float, rows: int | None = None) -> None:
        super().observe(drafted, accepted, draft_s, target_s, rows)
        if drafted:
            self.length = min(self.max_length, self.length + 2) if accepted == drafted else max(1, self.length - 1)


class ConfidenceThreshold(SpeculativePolicy):
    """Stop when the drafted token's probability q(X) falls below ``threshold``."""

    def __init__(self, threshold: float = 0.4, max_draft_tokens: int = 8):
        super().__init__(max_draft_tokens)
        self.threshold = threshold

    def decide(self, state: MDPState) -> bool:
        return state.token_prob >= self.threshold


class EntropyStop(SpeculativePolicy):
    """AdaEDL-style: stop when the entropy-based lower bound on acceptance, 1 - sqrt(gamma H(q)),
    falls below ``threshold`` (Agrawal et al. 2024)."""

    def __init__(self, threshold: float = 0.4, gamma: float = 0.6, max_draft_tokens: int = 8):
        super().__init__(max_draft_tokens)
        self.threshold, self.gamma = threshold, gamma

    def decide(self, state: MDPState) -> bool:
        return 1.0 - math.sqrt(self.gamma * max(state.entropy, 0.0)) >= self.threshold
