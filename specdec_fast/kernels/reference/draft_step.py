"""Draft step, reference: warp the draft's logits, sample a token, report the MDP features."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..sampling import entropy, sample_inverse_cdf, warp_logits


class DraftStepOutput(NamedTuple):
    """Result of one draft step for a batch of B rows.

    tokens [B] int64: the sampled token X ~ q;
    probs [B, V] fp32: q, the warped distribution X was drawn from (what verify needs; None from
        ``point_mass_step``, whose q is the point mass on X);
    token_prob [B] fp32: q(X);
    entropy [B] fp32: H(q) in nats;
    top1_prob [B] fp32: max_x q(x).

    A greedy row's q is the point mass on the argmax, whose features say nothing; its
    token_prob, entropy and top1_prob are those of the draft's distribution at temperature 1
    (same top-k / top-p), so that a draft-length policy still sees the draft's confidence.
    """

    tokens: Tensor
    probs: Tensor | None
    token_prob: Tensor
    entropy: Tensor
    top1_prob: Tensor


def draft_step_reference(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniforms: Tensor) -> DraftStepOutput:
    """logits [B, V]; temperature, top_k, top_p [B]; uniforms [B] in (0, 1]."""
    q = warp_logits(logits, temperature, top_k, top_p)
    tokens = sample_inverse_cdf(q, uniforms)
    greedy = temperature == 0
    described = warp_logits(logits, torch.where(greedy, 1.0, temperature), top_k, top_p) if greedy.any() else q
    token_prob = described.gather(-1, tokens[:, None]).squeeze(-1)
    return DraftStepOutput(tokens, q, token_prob, entropy(described), described.amax(-1))
