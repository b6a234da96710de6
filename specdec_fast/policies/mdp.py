"""Draft-length policies: the MDP of speculative decoding (docs/design.md, "The MDP").

After each drafted token a policy chooses CONTINUE or STOP; before a round it may choose
not to draft at all. It sees draft-side features (:class:`MDPState`) and past rounds only,
never the current round's target outputs or uniforms, so it chooses how many tokens to
draft and cannot bias which are accepted: the output stays the target's distribution.

Before the first round the loop hands the policy its :class:`~specdec_fast.policies.calibration.
Calibration` (``use_calibration``), then calls, per round: ``begin_round(remaining)`` -> the most
tokens to draft (0: none); ``propose_first(step, temperature)`` after the round's first draft
pass -> whether to verify its token at all (False: the round verifies nothing, and costs one
target pass and the draft pass); ``continue_drafting(position, step, temperature)`` after each
drafted token but the last allowed one; ``observe(drafted, accepted, draft_s, target_s)`` after
verification, with the round's measured draft and target (+ verify) seconds.

``continue_drafting`` may look at the drafted token itself (the next token is drawn afresh
from q, whatever came before), but ``propose_first`` must not: withholding a token *because
of its value* would verify a draft distribution other than q. It sees the draft's distribution
at that position (entropy, top-1 probability), a function of the committed prefix only.

The batched loop (``batch_generate``) drafts the same number of tokens for all ``rows``
sequences of a round, chosen before drafting: it calls ``begin_round(remaining, rows)``
(remaining: the largest budget left in the batch) and ``observe(drafted, accepted,
draft_s, target_s, rows)`` with ``accepted`` the mean over the rows; it never calls
``propose_first`` or ``continue_drafting``. ``rows=None`` means the single-sequence loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from ..kernels import DraftStepOutput
from .calibration import Calibration

FEATURES = ("position", "entropy", "top1", "token_prob", "survival", "recent_acceptance", "remaining", "temperature")


@dataclass
class MDPState:
    """The state after drafting a token (the seed's name): the features a policy decides on.

    position: tokens drafted this round (1 for the first); entropy, top1, token_prob: H(q),
    max q and q(X) of the token just drafted (when greedy, of the draft's distribution at
    temperature 1: see DraftStepOutput); survival: the policy's predicted probability
    (for block verification, the clipped cumulative ratio) that every token drafted so far
    is accepted; recent_acceptance: the running rate at which past rounds' first drafted token
    was accepted (unlike the rate per drafted token it does not depend on how many tokens the
    rounds drafted, so the traces a policy learns from, drafted at a fixed length, describe the
    policy's own rounds); remaining: the
    token budget left after this round's drafts; temperature: the sampling temperature (0:
    greedy), on which acceptance depends for the same draft features.
    """

    position: int
    entropy: float
    top1: float
    token_prob: float
    survival: float
    recent_acceptance: float
    remaining: int
    temperature: float

    def features(self) -> torch.Tensor:
        """fp32 [len(FEATURES)], in FEATURES order (remaining as log1p)."""
        return torch.tensor([self.position, self.entropy, self.top1, self.token_prob, self.survival,
                             self.recent_acceptance, math.log1p(self.remaining), self.temperature], dtype=torch.float32)


class DraftPolicy(Protocol):
    def use_calibration(self, calibration: Calibration | None) -> None: ...

    def begin_round(self, remaining: int, rows: int | None = None) -> int: ...

    def propose_first(self, step: DraftStepOutput, temperature: float) -> bool: ...

    def continue_drafting(self, position: int, step: DraftStepOutput, temperature: float) -> bool: ...

    def observe(self, drafted: int, accepted: float, draft_s: float, target_s: float, rows: int | None = None) -> None: ...


class SpeculativePolicy:
    """Base of the MDP policies (the seed's name): tracks the round and the history, builds an
    :class:`MDPState` after each drafted token and asks :meth:`decide` (True = CONTINUE)."""

    def __init__(self, max_draft_tokens: int = 8, smoothing: float = 0.9):
        if int(max_draft_tokens) != max_draft_tokens or max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be an integer >= 0, got {max_draft_tokens}")
        self.max_length = int(max_draft_tokens)
        self.smoothing = smoothing
        self.recent_acceptance = 0.5  # running acceptance rate of past rounds' first drafted token
        self.survival = 1.0
        self.remaining = 0

    def use_calibration(self, calibration: Calibration | None) -> None:
        """Costs measured where the loop runs (the loops call this before the first round of every
        generation); policies that weigh costs start from them. None: not calibrated (a GPU)."""

    def begin_round(self, remaining: int, rows: int | None = None) -> int:
        self.survival, self.remaining = 1.0, remaining
        return min(self.max_length, remaining)

    def propose_first(self, step: DraftStepOutput, temperature: float) -> bool:
        """Verify the round's first drafted token (True), or nothing this round; by default always."""
        return True

    def first_state(self, step: DraftStepOutput, temperature: float) -> MDPState:
        """The state of the round's first draft position as ``propose_first`` may see it: q(X) is
        replaced by the top-1 probability (equal to it when greedy), the drafted token is not read."""
        top1 = float(step.top1_prob[0])
        return MDPState(1, float(step.entropy[0]), top1, top1, 1.0, self.recent_acceptance, self.remaining - 1, temperature)

    def continue_drafting(self, position: int, step: DraftStepOutput, temperature: float) -> bool:
        state = MDPState(position + 1, float(step.entropy[0]), float(step.top1_prob[0]), float(step.token_prob[0]),
                         self.survival, self.recent_acceptance, self.remaining - position - 1, temperature)
        return self.decide(state)

    def decide(self, state: MDPState) -> bool:
        return True

    def observe(self, drafted: int, accepted: float, draft_s: float, target_s: float, rows: int | None = None) -> None:
        if drafted and rows is None:  # batch rounds build no MDPState
            a = self.smoothing
            self.recent_acceptance = a * self.recent_acceptance + (1 - a) * float(accepted >= 1)
