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

A point-mass row (Q_i = one-hot(X_i)): p_i = p_{i-1} P_i(X_i), the product of the target's
probabilities of the drafted prefix, and r_i = p_i (1 - P_{i+1}(X_{i+1})) = p_i - p_{i+1} in
closed form (no pass over the vocabulary), so h_i = (p_i - p_{i+1}) / (1 - p_{i+1}); the
residual at the stop is p_tau P_{tau+1} with X_{tau+1} removed (docs/design.md).

p_i, r_i and h_i are computed in float64 from the fp32 probabilities. Greedy rows (point
masses) accept the matching prefix, exactly as token-wise verification does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..sampling import sample_inverse_cdf
from .verify import RESIDUAL_EPS, checked_inputs, emitted_tokens


def verify_block_reference(
    target_logits: Tensor,  # [B, K+1, V]
    draft_probs: Tensor | None,  # [B, K, V]; None: every row a point mass
    point_mass: Tensor,  # [B] bool
    draft_tokens: Tensor,  # [B, K] int64
    draft_lens: Tensor,  # [B] int64 in [0, K]
    temperature: Tensor,  # [B]
    top_k: Tensor,  # [B]
    top_p: Tensor,  # [B]
    uniforms: Tensor,  # [B, K+1] in (0, 1]: u_1..u_K, then one for the emitted sample
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (num_accepted [B], tokens [B, K+1], num_emitted [B], status [B]), as verify_reference."""
    v = checked_inputs(target_logits, draft_probs, point_mass, draft_tokens, draft_lens, temperature, top_k, top_p,
                       uniforms)
    p, q, lens = v.p, v.q, v.lens
    p_x, q_x = v.p_x.double(), v.q_x.double()
    batch, k = v.tokens.shape
    rows = torch.arange(batch, device=target_logits.device)
    ratio = torch.where(v.drafted & (q_x > 0), p_x / q_x.clamp_min(1e-300), 0.0)
    survival = [torch.ones(batch, dtype=torch.float64, device=rows.device)]  # p_0..p_K
    for i in range(k):
        survival.append((survival[-1] * ratio[:, i]).clamp(max=1.0))
    clipped = torch.stack(survival, 1)  # [B, K+1]

    # h_i for i = 1..K: r_i uses P_{i+1} = p[:, i] and Q_{i+1} = q[:, i] (i < K).
    h = torch.zeros(batch, k, dtype=torch.float64, device=rows.device)
    if k > 1:
        r = (clipped[:, 1:k, None] * p[:, 1:k].double() - q[:, 1:k].double()).clamp_min(0.0).sum(-1)  # [B, K-1]
        r = torch.where(point_mass[:, None], clipped[:, 1:k] * (1.0 - p_x[:, 1:k]), r)
        denominator = r + 1.0 - clipped[:, 1:k]
        h[:, : k - 1] = torch.where(denominator > 0, r / denominator.clamp_min(1e-300), 1.0)
    positions = torch.arange(1, k + 1, device=rows.device)[None, :]  # i = 1..K
    h = torch.where(positions == lens[:, None], clipped[:, 1:], h)  # h_L = p_L
    hit = (positions <= lens[:, None]) & (uniforms[:, :k].double() <= h)
    tau = (hit * positions).amax(-1) if k else torch.zeros(batch, dtype=torch.int64, device=rows.device)

    p_tau = clipped[rows, tau]
    stop = tau < lens
    q_next = q[rows, tau.clamp(max=k - 1)].double() * stop[:, None] if k else torch.zeros_like(p[:, 0], dtype=torch.float64)
    residual = (p_tau[:, None] * p[rows, tau].double() - q_next).clamp_min(0.0)
    residual = torch.where(stop[:, None] & (residual.sum(-1, keepdim=True) > RESIDUAL_EPS), residual, p[rows, tau].double())
    y = sample_inverse_cdf(residual, uniforms[:, k])
    return tau, emitted_tokens(v.tokens, tau, y), tau + 1, v.status
