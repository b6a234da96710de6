"""Block verification, reference (Sun et al., "Block Verification Accelerates Speculative
Decoding", ICLR 2025). Lossless, and never accepts fewer tokens in expectation than
token-wise verification. For a row with L drafted tokens X_1..X_L, P_i / Q_i the target /
draft distributions at position i (P_{L+1} the bonus position):

    p_0 = 1,   p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i))            (Q_i(X_i) = 0 gives p_i = 0)
    r_i = sum_x max(p_i P_{i+1}(x) - Q_{i+1}(x), 0)                 i = 1..L-1
    h_i = r_i / (r_i + 1 - p_i)  (1 if the denominator is 0),   h_L = p_L
    tau = max{ i <= L : u_i <= h_i }   (0 if none)
    emit X_1..X_tau, then Y ~ P_{L+1} if tau = L,
    else Y ~ norm(max(p_tau P_{tau+1} - Q_{tau+1}, 0)), or P_{tau+1} if that has no mass.

p_i, r_i and h_i are computed in float64 from the fp32 probabilities. Greedy rows (point
masses) accept the matching prefix, exactly as token-wise verification does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..sampling import sample_inverse_cdf
from .verify import RESIDUAL_EPS, VerifyOutput, emitted_tokens, warped_target


def verify_block_reference(
    target_logits: Tensor,  # [B, K+1, V]
    draft_probs: Tensor,  # [B, K, V]
    draft_tokens: Tensor,  # [B, K] int64
    draft_lens: Tensor,  # [B] int64 in [0, K]
    temperature: Tensor,  # [B]
    top_k: Tensor,  # [B]
    top_p: Tensor,  # [B]
    uniforms: Tensor,  # [B, K+1] in (0, 1]: u_1..u_K, then one for the emitted sample
) -> VerifyOutput:
    p, drafted, p_x, q_x = warped_target(target_logits, draft_probs, draft_tokens, draft_lens, temperature, top_k, top_p)
    p_x, q_x, q = p_x.double(), q_x.double(), draft_probs
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=target_logits.device)
    ratio = torch.where(drafted & (q_x > 0), p_x / q_x.clamp_min(1e-300), 0.0)
    survival = [torch.ones(batch, dtype=torch.float64, device=rows.device)]  # p_0..p_K
    for i in range(k):
        survival.append((survival[-1] * ratio[:, i]).clamp(max=1.0))
    clipped = torch.stack(survival, 1)  # [B, K+1]

    # h_i for i = 1..K: r_i uses P_{i+1} = p[:, i] and Q_{i+1} = q[:, i] (i < K).
    h = torch.zeros(batch, k, dtype=torch.float64, device=rows.device)
    if k > 1:
        r = (clipped[:, 1:k, None] * p[:, 1:k].double() - q[:, 1:k].double()).clamp_min(0.0).sum(-1)  # [B, K-1]
        denominator = r + 1.0 - clipped[:, 1:k]
        h[:, : k - 1] = torch.where(denominator > 0, r / denominator.clamp_min(1e-300), 1.0)
    positions = torch.arange(1, k + 1, device=rows.device)[None, :]  # i = 1..K
    h = torch.where(positions == draft_lens[:, None], clipped[:, 1:], h)  # h_L = p_L
    hit = (positions <= draft_lens[:, None]) & (uniforms[:, :k].double() <= h)
    tau = (hit * positions).amax(-1) if k else torch.zeros(batch, dtype=torch.int64, device=rows.device)

    p_tau = clipped[rows, tau]
    stop = tau < draft_lens
    q_next = q[rows, tau.clamp(max=k - 1)].double() * stop[:, None] if k else torch.zeros_like(p[:, 0], dtype=torch.float64)
    residual = (p_tau[:, None] * p[rows, tau].double() - q_next).clamp_min(0.0)
    residual = torch.where(stop[:, None] & (residual.sum(-1, keepdim=True) > RESIDUAL_EPS), residual, p[rows, tau].double())
    y = sample_inverse_cdf(residual, uniforms[:, k])

    return VerifyOutput(tau, emitted_tokens(draft_tokens, tau, y), tau + 1)
