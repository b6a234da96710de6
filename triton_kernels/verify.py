"""Verification in Triton, token-wise and block: one program per batch row
(references: specdec_fast/reference/verify.py and verify_block.py). A point-mass row (a
draft of fixed tokens) reads no q: its q is one-hot at the drafted token. Each row writes a
status (reference/verify.py STATUS): what is wrong with the inputs it read, 0 if nothing."""

import torch
import triton
import triton.language as tl

from .sampling import RESIDUAL_EPS, TILE, prob_of, row_dist, sample_row, weight_totals


@triton.jit
def emit(b, tokens_ptr, out_ptr, accepted_ptr, status_ptr, accepted, y, status, K):
    """Row b's outputs: the accepted drafts, the emitted token y, then -1; and its status."""
    for i in range(0, K + 1):
        drafted = tl.load(tokens_ptr + b * K + i, mask=i < accepted, other=-1)
        tl.store(out_ptr + b * (K + 1) + i, tl.where(i < accepted, drafted, tl.where(i == accepted, y, -1)))
    tl.store(accepted_ptr + b, accepted)
    tl.store(status_ptr + b, status.to(tl.int64))


@triton.jit
def input_status(b, tokens_ptr, length, u_ptr, K, V):
    """1 if the draft length is outside [0, K], 2 if a drafted token is outside [0, V), 3 if a
    uniform is outside (0, 1], else 0."""
    status = tl.where((length < 0) | (length > K), 1, 0)
    for i in range(0, K + 1):
        x = tl.load(tokens_ptr + b * K + i, mask=(i < length) & (i < K), other=0)
        u = tl.load(u_ptr + b * (K + 1) + i)
        bad_u = ~((u > 0) & (u <= 1))
        status = tl.where(status != 0, status, tl.where((x < 0) | (x >= V), 2, tl.where(bad_u, 3, 0)))
    return status


@triton.jit
def draft_prob(q_ptr, b, j, K, V, x, point):
    """q_j(X_j): 1 for a point-mass row, else the draft's probability, NaN if it is not one."""
    q_x = tl.load(q_ptr + (b * K + j) * V + x, mask=point == 0, other=1.0)
    return tl.where((q_x >= 0) & (q_x < float("inf")), q_x, float("nan"))


@triton.jit
def stop_token(rows, q_ptr, u_ptr, b, accepted, length, scale, t, top_k, top_p, tokens_ptr, point, K, V,
               BLOCK: tl.constexpr):
    """(token, status) emitted after `accepted` drafts: argmax for greedy rows; else a sample of
    max(scale p - q, 0) at a stop before the draft's end (p if that has no mass), of p at the end."""
    row = rows + accepted * V
    argmax, min_key, m, inv_sum, status = row_dist(row, V, t, top_k, top_p, BLOCK)
    y = argmax
    if (argmax < 0) & (status == 0):
        rejected = accepted < length
        q_row = q_ptr + (b * K + tl.minimum(accepted, tl.maximum(K - 1, 0))) * V
        x = tl.load(tokens_ptr + b * K + accepted, mask=rejected, other=-1)
        mass, total, bad = weight_totals(row, q_row, V, t, min_key, m, inv_sum, rejected, scale, point, x, BLOCK)
        status = tl.where(bad > 0, 7, 0)
        residual = rejected & (mass.to(tl.float32) > RESIDUAL_EPS)
        total = tl.where(residual, mass, total)
        u = tl.load(u_ptr + b * (K + 1) + K)
        y = sample_row(row, q_row, V, t, min_key, m, inv_sum, residual, scale, total, u, point, x, BLOCK)
    return y, status


@triton.jit
def token_wise_row(b, target_ptr, q_ptr, point, tokens_ptr, lens_ptr, t, top_k, top_p, u_ptr, accepted_ptr, out_ptr,
                   status_ptr, K, V, BLOCK: tl.constexpr):
    """Accept X_j while u_j q_j(X_j) <= p_j(X_j); then the stop token."""
    length = tl.load(lens_ptr + b)
    status = input_status(b, tokens_ptr, length, u_ptr, K, V)
    rows = target_ptr + b * (K + 1) * V
    j = tl.zeros((), tl.int64)
    searching = (j < length) & (status == 0)
    while searching:
        argmax, min_key, m, inv_sum, status = row_dist(rows + j * V, V, t, top_k, top_p, BLOCK)
        x = tl.load(tokens_ptr + b * K + j)
        q_x = draft_prob(q_ptr, b, j, K, V, x, point)
        status = tl.where((status == 0) & (q_x != q_x), 7, status)
        p_x = prob_of(tl.load(rows + j * V + x), x, t, argmax, min_key, m, inv_sum)
        if (status == 0) & (q_x > 0) & (tl.load(u_ptr + b * (K + 1) + j) * q_x <= p_x):  # q(x) == 0: reject
            j += 1
            searching = j < length
        else:
            searching = False
    y = tl.full((), -1, tl.int64)
    if status == 0:
        y, status = stop_token(rows, q_ptr, u_ptr, b, j, length, 1.0, t, top_k, top_p, tokens_ptr, point, K, V, BLOCK)
    emit(b, tokens_ptr, out_ptr, accepted_ptr, status_ptr, j, y, status, K)


@triton.jit(do_not_specialize=["K", "V"])
def verify_kernel(
    target_ptr,  # [B, K+1, V] logits (fp32/bf16/fp16)
    q_ptr,  # [B, K, V] fp32 (any fp32 tensor if every row is a point mass: never read)
    point_ptr,  # [B] int8: the row is a point mass
    tokens_ptr,  # [B, K] int64
    lens_ptr,  # [B] int64
    temperature_ptr, top_k_ptr, top_p_ptr,  # [B]
    u_ptr,  # [B, K+1] fp32
    accepted_ptr,  # [B] int64 out
    out_ptr,  # [B, K+1] int64 out
    status_ptr,  # [B] int64 out
    K, V,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    token_wise_row(b, target_ptr, q_ptr, tl.load(point_ptr + b), tokens_ptr, lens_ptr, tl.load(temperature_ptr + b),
                   tl.load(top_k_ptr + b), tl.load(top_p_ptr + b), u_ptr, accepted_ptr, out_ptr, status_ptr, K, V, BLOCK)


@triton.jit(do_not_specialize=["K", "V"])
def verify_block_kernel(target_ptr, q_ptr, point_ptr, tokens_ptr, lens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, u_ptr,
                        accepted_ptr, out_ptr, status_ptr, K, V, BLOCK: tl.constexpr):
    """Block verification (same arguments as verify_kernel): p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i)),
    h_i = r_i / (r_i + 1 - p_i) with r_i = sum max(p_i P_{i+1} - Q_{i+1}, 0) (p_i (1 - P_{i+1}(X_{i+1}))
    for a point mass), h_L = p_L, tau = max{i : u_i <= h_i}."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    point = tl.load(point_ptr + b)
    if t == 0:  # point masses: block and token-wise accept the same matching prefix
        token_wise_row(b, target_ptr, q_ptr, point, tokens_ptr, lens_ptr, t, top_k, top_p, u_ptr, accepted_ptr, out_ptr,
                       status_ptr, K, V, BLOCK)
    else:
        length = tl.load(lens_ptr + b)
        status = input_status(b, tokens_ptr, length, u_ptr, K, V)
        rows = target_ptr + b * (K + 1) * V
        clipped = tl.full((), 1.0, tl.float64)  # p_j
        clipped_tau = tl.full((), 1.0, tl.float64)
        tau = tl.zeros((), tl.int64)
        for j in range(0, tl.where(status == 0, length, 0)):  # row j holds P_{j+1}; X_{j+1} = tokens[j]
            if status == 0:
                argmax, min_key, m, inv_sum, status = row_dist(rows + j * V, V, t, top_k, top_p, BLOCK)
                x = tl.load(tokens_ptr + b * K + j)
                q_x = draft_prob(q_ptr, b, j, K, V, x, point)
                status = tl.where((status == 0) & (q_x != q_x), 7, status)
                p_x = prob_of(tl.load(rows + j * V + x), x, t, argmax, min_key, m, inv_sum)
                if (j > 0) & (status == 0):
                    r, _, bad = weight_totals(rows + j * V, q_ptr + (b * K + j) * V, V, t, min_key, m, inv_sum,
                                              point == 0, clipped.to(tl.float32), 0, -1, BLOCK)
                    status = tl.where(bad > 0, 7, status)
                    r = tl.where(point != 0, clipped * (1.0 - p_x.to(tl.float64)), r)
                    denominator = r + 1.0 - clipped
                    h = tl.where(denominator > 0, r / denominator, 1.0)
                    if tl.load(u_ptr + b * (K + 1) + j - 1).to(tl.float64) <= h:
                        tau = j
                        clipped_tau = clipped
                clipped = tl.where(q_x > 0, tl.minimum(clipped * p_x.to(tl.float64) / q_x.to(tl.float64), 1.0), 0.0)
        if (length > 0) & (status == 0):
            if tl.load(u_ptr + b * (K + 1) + length - 1).to(tl.float64) <= clipped:  # h_L = p_L
                tau = length
                clipped_tau = clipped
        y = tl.full((), -1, tl.int64)
        if status == 0:
            y, status = stop_token(rows, q_ptr, u_ptr, b, tau, length, clipped_tau.to(tl.float32), t, top_k, top_p,
                                   tokens_ptr, point, K, V, BLOCK)
        emit(b, tokens_ptr, out_ptr, accepted_ptr, status_ptr, tau, y, status, K)


def _launch(kernel, target_logits, draft_probs, point_mass, draft_tokens, draft_lens, temperature, top_k, top_p,
            uniforms):
    batch, k_plus_1, vocab = target_logits.shape
    longs = dict(dtype=torch.int64, device=target_logits.device)
    accepted, status = torch.empty(batch, **longs), torch.empty(batch, **longs)
    tokens = torch.empty(batch, k_plus_1, **longs)
    q = draft_probs.contiguous().float() if draft_probs is not None else torch.zeros(1, device=target_logits.device)
    if batch:
        kernel[(batch,)](
            target_logits.contiguous(), q, point_mass.contiguous().to(torch.int8), draft_tokens.contiguous().long(),
            draft_lens.contiguous().long(), temperature.contiguous().float(), top_k.contiguous().long(),
            top_p.contiguous().float(), uniforms.contiguous().float(), accepted, tokens, status, k_plus_1 - 1, vocab,
            BLOCK=TILE, num_warps=8,
        )
    return accepted, tokens, accepted + 1, status


def verify(*args):
    """Token-wise; same contract as specdec_fast.reference.verify_reference: (num_accepted, tokens, num_emitted, status)."""
    return _launch(verify_kernel, *args)


def verify_block(*args):
    """Block; same contract as specdec_fast.reference.verify_block_reference."""
    return _launch(verify_block_kernel, *args)
