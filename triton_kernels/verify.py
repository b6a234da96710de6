"""Verification in Triton, token-wise and block: one program per batch row
(references: specdec_fast/reference/verify.py and verify_block.py)."""

import torch
import triton
import triton.language as tl

from .sampling import RESIDUAL_EPS, TILE, prob_of, row_dist, sample_row, weight_totals


@triton.jit
def emit(b, tokens_ptr, out_ptr, accepted_ptr, accepted, y, K):
    """Row b's outputs: the accepted drafts, the emitted token y, then -1."""
    for i in range(0, K + 1):
        drafted = tl.load(tokens_ptr + b * K + i, mask=i < accepted, other=-1)
        tl.store(out_ptr + b * (K + 1) + i, tl.where(i < accepted, drafted, tl.where(i == accepted, y, -1)))
    tl.store(accepted_ptr + b, accepted)


@triton.jit
def stop_token(rows, q_ptr, u_ptr, b, accepted, length, scale, t, top_k, top_p, K, V, BLOCK: tl.constexpr):
    """The token emitted after `accepted` drafts: argmax for greedy rows; else a sample of
    max(scale p - q, 0) at a stop before the draft's end (p if that has no mass), of p at the end."""
    row = rows + accepted * V
    argmax, min_key, m, inv_sum = row_dist(row, V, t, top_k, top_p, BLOCK)
    y = argmax
    if argmax < 0:
        rejected = accepted < length
        q_row = q_ptr + (b * K + tl.minimum(accepted, tl.maximum(K - 1, 0))) * V
        mass, total = weight_totals(row, q_row, V, t, min_key, m, inv_sum, rejected, scale, BLOCK)
        residual = rejected & (mass.to(tl.float32) > RESIDUAL_EPS)
        total = tl.where(residual, mass, total)
        u = tl.load(u_ptr + b * (K + 1) + K)
        y = sample_row(row, q_row, V, t, min_key, m, inv_sum, residual, scale, total, u, BLOCK)
    return y


@triton.jit
def token_wise_row(b, target_ptr, q_ptr, tokens_ptr, lens_ptr, t, top_k, top_p, u_ptr, accepted_ptr, out_ptr, K, V,
                   BLOCK: tl.constexpr):
    """Accept X_j while u_j q_j(X_j) <= p_j(X_j); then the stop token."""
    length = tl.load(lens_ptr + b)
    rows = target_ptr + b * (K + 1) * V
    j = tl.zeros((), tl.int64)
    searching = j < length
    while searching:
        argmax, min_key, m, inv_sum = row_dist(rows + j * V, V, t, top_k, top_p, BLOCK)
        x = tl.load(tokens_ptr + b * K + j)
        q_x = tl.load(q_ptr + (b * K + j) * V + x)
        p_x = prob_of(tl.load(rows + j * V + x), x, t, argmax, min_key, m, inv_sum)
        if (q_x > 0) & (tl.load(u_ptr + b * (K + 1) + j) * q_x <= p_x):  # q(x) == 0: reject
            j += 1
            searching = j < length
        else:
            searching = False
    y = stop_token(rows, q_ptr, u_ptr, b, j, length, 1.0, t, top_k, top_p, K, V, BLOCK)
    emit(b, tokens_ptr, out_ptr, accepted_ptr, j, y, K)


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
    token_wise_row(b, target_ptr, q_ptr, tokens_ptr, lens_ptr, tl.load(temperature_ptr + b), tl.load(top_k_ptr + b),
                   tl.load(top_p_ptr + b), u_ptr, accepted_ptr, out_ptr, K, V, BLOCK)


@triton.jit(do_not_specialize=["K", "V"])
def verify_block_kernel(target_ptr, q_ptr, tokens_ptr, lens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, u_ptr,
                        accepted_ptr, out_ptr, K, V, BLOCK: tl.constexpr):
    """Block verification (same arguments as verify_kernel): p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i)),
    h_i = r_i / (r_i + 1 - p_i) with r_i = sum max(p_i P_{i+1} - Q_{i+1}, 0), h_L = p_L,
    tau = max{i : u_i <= h_i}."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    if t == 0:  # point masses: block and token-wise accept the same matching prefix
        token_wise_row(b, target_ptr, q_ptr, tokens_ptr, lens_ptr, t, top_k, top_p, u_ptr, accepted_ptr, out_ptr, K, V,
                       BLOCK)
    else:
        length = tl.load(lens_ptr + b)
        rows = target_ptr + b * (K + 1) * V
        clipped = tl.full((), 1.0, tl.float64)  # p_j
        clipped_tau = tl.full((), 1.0, tl.float64)
        tau = tl.zeros((), tl.int64)
        for j in range(0, length):  # row j holds P_{j+1}; X_{j+1} = tokens[j]
            argmax, min_key, m, inv_sum = row_dist(rows + j * V, V, t, top_k, top_p, BLOCK)
            if j > 0:
                r, _ = weight_totals(rows + j * V, q_ptr + (b * K + j) * V, V, t, min_key, m, inv_sum, True,
                                     clipped.to(tl.float32), BLOCK)
                denominator = r + 1.0 - clipped
                h = tl.where(denominator > 0, r / denominator, 1.0)
                if tl.load(u_ptr + b * (K + 1) + j - 1).to(tl.float64) <= h:
                    tau = j
                    clipped_tau = clipped
            x = tl.load(tokens_ptr + b * K + j)
            q_x = tl.load(q_ptr + (b * K + j) * V + x)
            p_x = prob_of(tl.load(rows + j * V + x), x, t, argmax, min_key, m, inv_sum)
            clipped = tl.where(q_x > 0, tl.minimum(clipped * p_x.to(tl.float64) / q_x.to(tl.float64), 1.0), 0.0)
        if length > 0:
            if tl.load(u_ptr + b * (K + 1) + length - 1).to(tl.float64) <= clipped:  # h_L = p_L
                tau = length
                clipped_tau = clipped
        y = stop_token(rows, q_ptr, u_ptr, b, tau, length, clipped_tau.to(tl.float32), t, top_k, top_p, K, V, BLOCK)
        emit(b, tokens_ptr, out_ptr, accepted_ptr, tau, y, K)


def _launch(kernel, target_logits, draft_probs, draft_tokens, draft_lens, temperature, top_k, top_p, uniforms):
    batch, k_plus_1, vocab = target_logits.shape
    longs = dict(dtype=torch.int64, device=target_logits.device)
    accepted = torch.empty(batch, **longs)
    tokens = torch.empty(batch, k_plus_1, **longs)
    if batch:
        kernel[(batch,)](
            target_logits.contiguous(), draft_probs.contiguous().float(), draft_tokens.contiguous().long(),
            draft_lens.contiguous().long(), temperature.contiguous().float(), top_k.contiguous().long(),
            top_p.contiguous().float(), uniforms.contiguous().float(), accepted, tokens, k_plus_1 - 1, vocab,
            BLOCK=TILE, num_warps=8,
        )
    return accepted, tokens, accepted + 1


def verify(*args):
    """Token-wise; same contract as specdec_fast.reference.verify_reference: (num_accepted, tokens, num_emitted)."""
    return _launch(verify_kernel, *args)


def verify_block(*args):
    """Block; same contract as specdec_fast.reference.verify_block_reference."""
    return _launch(verify_block_kernel, *args)
