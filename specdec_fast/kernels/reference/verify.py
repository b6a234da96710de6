"""Token-wise verification, reference (Leviathan et al. 2023; Chen et al. 2023).

For each row b with L = draft_lens[b] drafted tokens X_1..X_L, X_i ~ q_i:

- accept X_i iff u_i * q_i(X_i) <= p_i(X_i), i.e. with probability min(1, p_i/q_i);
  q_i(X_i) == 0 cannot come from sampling q_i, so it is rejected;
- at the first rejection j emit Y ~ norm(max(0, p_j - q_j)); if that residual has no
  mass (p_j == q_j) emit Y ~ p_j. "No mass" means below RESIDUAL_EPS: fp32 rounding
  leaves ~1e-7 of noise where p == q, and a token drawn from noise is arbitrary. The
  rule changes the output distribution by at most P(reject) <= the residual mass;
- if all L are accepted emit the bonus Y ~ p_{L+1};
- greedy rows (temperature 0) need no special case: warping makes p_i a point mass
  on argmax, so X_i is accepted iff it is the argmax and Y is the argmax at the stop.

Every row emits between 1 and L + 1 tokens, distributed exactly as the target's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..sampling import sample_inverse_cdf, warp_logits

RESIDUAL_EPS = 1e-6


class VerifyOutput(NamedTuple):
    """Result of verifying a batch of B drafts of up to K tokens.

    num_accepted [B] int64: accepted draft tokens, in [0, draft_lens];
    tokens [B, K+1] int64: the emitted tokens (accepted drafts, then the resampled or
        bonus token), padded with -1;
    num_emitted [B] int64: num_accepted + 1.
    """

    num_accepted: Tensor
    tokens: Tensor
    num_emitted: Tensor


def verify_reference(
    target_logits: Tensor,  # [B, K+1, V]
    draft_probs: Tensor,  # [B, K, V] the warped q each draft token was drawn from
    draft_tokens: Tensor,  # [B, K] int64
    draft_lens: Tensor,  # [B] int64 in [0, K]
    temperature: Tensor,  # [B]
    top_k: Tensor,  # [B]
    top_p: Tensor,  # [B]
    uniforms: Tensor,  # [B, K+1] in (0, 1]: K acceptance tests, then one for the emitted sample
) -> VerifyOutput:
    p, drafted, p_x, q_x = warped_target(target_logits, draft_probs, draft_tokens, draft_lens, temperature, top_k, top_p)
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=target_logits.device)
    accept = drafted & (q_x > 0) & (uniforms[:, :k] * q_x <= p_x)
    num_accepted = accept.long().cumprod(-1).sum(-1)  # accepted prefix: stops at the first rejection

    j = num_accepted
    p_j = p[rows, j]  # [B, V]
    rejected = j < draft_lens
    if k > 0:
        q_j = draft_probs[rows, j.clamp(max=k - 1)] * rejected[:, None]  # 0 for the bonus position
    else:
        q_j = torch.zeros_like(p_j)
    residual = (p_j - q_j).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > RESIDUAL_EPS, residual, p_j)
    y = sample_inverse_cdf(residual, uniforms[:, k])

    return VerifyOutput(num_accepted, emitted_tokens(draft_tokens, num_accepted, y), num_accepted + 1)


def warped_target(target_logits: Tensor, draft_probs: Tensor, draft_tokens: Tensor, draft_lens: Tensor,
                  temperature: Tensor, top_k: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What both verifiers start from: p [B, K+1, V] (the warped target), drafted [B, K] (bool:
    position i < draft_lens), and p(X_i), q(X_i) [B, K] (X_i = 0 where nothing was drafted)."""
    batch, k_plus_1, _ = target_logits.shape
    expand = lambda t: t[:, None].expand(batch, k_plus_1)  # noqa: E731
    p = warp_logits(target_logits, expand(temperature), expand(top_k), expand(top_p))
    k = k_plus_1 - 1
    drafted = torch.arange(k, device=p.device)[None, :] < draft_lens[:, None]
    x = torch.where(drafted, draft_tokens, 0)
    return p, drafted, p[:, :k].gather(-1, x[..., None]).squeeze(-1), draft_probs.gather(-1, x[..., None]).squeeze(-1)


def emitted_tokens(draft_tokens: Tensor, num_accepted: Tensor, y: Tensor) -> Tensor:
    """[B, K+1]: the first num_accepted drafts of each row, then y, then -1."""
    batch, k = draft_tokens.shape
    positions = torch.arange(k + 1, device=draft_tokens.device)[None, :]
    drafts = torch.cat([draft_tokens, torch.full((batch, 1), -1, device=draft_tokens.device)], 1)
    tokens = torch.where(positions < num_accepted[:, None], drafts, -1)
    return torch.where(positions == num_accepted[:, None], y[:, None], tokens)
