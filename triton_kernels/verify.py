"""Token-wise verification in Triton: one program per batch row (reference: specdec_fast/reference/verify.py)."""

import torch
import triton
import triton.language as tl

from .sampling import RESIDUAL_EPS, TILE, prob_of, row_dist, sample_row, weight_totals


@triton.jit(do_not_specialize=["K", "V"])
def verify_kernel(
    target_ptr,  # [B, K+1, V] logits (fp32/bf16/fp16)
    q_ptr,  # [B, K, V] fp32
    tokens_ptr,  # [B, K] int64
    lens_ptr,  # [B] int64
    temperature_ptr, top_k_ptr, top_p_ptr,  # [B]
    u_ptr,  # [B, K+1] fp32
    accepted_ptr,  # [B] int64 out
    out_ptr,  # [B, K+1] int64 out
    K, V,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    length = tl.load(lens_ptr + b)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    rows = target_ptr + b * (K + 1) * V

    # Accept X_j while u_j q_j(X_j) <= p_j(X_j); the loop ends on the stop row (rejection or bonus).
    j = tl.zeros((), tl.int64)
    searching = True
    argmax, min_key = tl.full((), -1, tl.int64), tl.zeros((), tl.int64)  # the stop row's distribution
    m, inv_sum = tl.zeros((), tl.float32), tl.full((), 1.0, tl.float64)
    while searching:
        argmax, min_key, m, inv_sum = row_dist(rows + j * V, V, t, top_k, top_p, BLOCK)
        if j < length:
            x = tl.load(tokens_ptr + b * K + j)
            q_x = tl.load(q_ptr + (b * K + j) * V + x)
            p_x = prob_of(tl.load(rows + j * V + x), x, t, argmax, min_key, m, inv_sum)
            if (q_x > 0) & (tl.load(u_ptr + b * (K + 1) + j) * q_x <= p_x):
                j += 1
            else:
                searching = False
        else:
            searching = False

    # The stop token: argmax for greedy rows; else the residual max(0, p - q) at a rejection,
    # p for the bonus or when the residual has no mass.
    y = argmax
    if argmax < 0:
        rejected = j < length
        q_row = q_ptr + (b * K + tl.minimum(j, tl.maximum(K - 1, 0))) * V
        mass, total = weight_totals(rows + j * V, q_row, V, t, min_key, m, inv_sum, rejected, BLOCK)
        residual = rejected & (mass.to(tl.float32) > RESIDUAL_EPS)
        total = tl.where(residual, mass, total)
        u = tl.load(u_ptr + b * (K + 1) + K)
        y = sample_row(rows + j * V, q_row, V, t, min_key, m, inv_sum, residual, total, u, BLOCK)

    for i in range(0, K + 1):  # accepted drafts, the stop token, then -1
        drafted = tl.load(tokens_ptr + b * K + i, mask=i < j, other=-1)
        tl.store(out_ptr + b * (K + 1) + i, tl.where(i < j, drafted, tl.where(i == j, y, -1)))
    tl.store(accepted_ptr + b, j)


def verify(target_logits: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           draft_lens: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           uniforms: torch.Tensor):
    """Same contract as specdec_fast.reference.verify_reference; returns (num_accepted, tokens, num_emitted)."""
    batch, k_plus_1, vocab = target_logits.shape
    longs = dict(dtype=torch.int64, device=target_logits.device)
    accepted = torch.empty(batch, **longs)
    tokens = torch.empty(batch, k_plus_1, **longs)
    if batch:
        verify_kernel[(batch,)](
            target_logits.contiguous(), draft_probs.contiguous().float(), draft_tokens.contiguous().long(),
            draft_lens.contiguous().long(), temperature.contiguous().float(), top_k.contiguous().long(),
            top_p.contiguous().float(), uniforms.contiguous().float(), accepted, tokens, k_plus_1 - 1, vocab,
            BLOCK=TILE, num_warps=8,
        )
    return accepted, tokens, accepted + 1
