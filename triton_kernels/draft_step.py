"""The draft step in Triton: warp, sample, q(token), entropy, top-1; one program per row
(reference: specdec_fast/reference/draft_step.py)."""

import torch
import triton
import triton.language as tl

from .sampling import TILE, argmax_row, exp_shifted, order_key, row_dist, sample_row, scaled, scaled_tile, weights_tile


@triton.jit(do_not_specialize=["V"])
def draft_step_kernel(
    logits_ptr,  # [B, V] (fp32/bf16/fp16)
    temperature_ptr, top_k_ptr, top_p_ptr, u_ptr,  # [B]
    tokens_ptr,  # [B] int64 out
    probs_ptr,  # [B, V] fp32 out: q
    token_prob_ptr, entropy_ptr, top1_ptr,  # [B] fp32 out
    V,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    t = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b)
    top_p = tl.load(top_p_ptr + b)
    row = logits_ptr + b * V
    # A greedy row's q is the point mass on the argmax; its features are those of the
    # distribution at temperature 1 (reference/draft_step.py).
    greedy = t == 0
    token = tl.full((), -1, tl.int64)
    if greedy:
        token, _ = argmax_row(row, V, BLOCK)
    t = tl.where(greedy, 1.0, t)
    _, min_key, m, inv_sum, _ = row_dist(row, V, t, top_k, top_p, BLOCK)  # logits checked in Python

    # Write q; sum p in float64 for the sampler; H(p) = sum p (log(sum) - (z - max)) over p > 0.
    log_sum = -tl.log(inv_sum).to(tl.float32)
    total = tl.zeros((), tl.float64)
    entropy = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        p = weights_tile(row, row, offs, V, t, min_key, m, inv_sum, False, 1.0, 0, -1)
        tl.store(probs_ptr + b * V + offs, tl.where(greedy, tl.where(offs == token, 1.0, 0.0), p), mask=offs < V)
        total += tl.sum(p.to(tl.float64), 0)
        z = scaled_tile(row, offs, V, t)
        entropy += tl.sum((p * (log_sum - tl.where(p > 0, z - m, 0.0))).to(tl.float64), 0)

    if token < 0:
        token = sample_row(row, row, V, t, min_key, m, inv_sum, False, 1.0, total, tl.load(u_ptr + b), 0, -1, BLOCK)
    z = scaled(tl.load(row + token).to(tl.float32), t)  # p(token), by the same formula as the stored p
    tl.store(tokens_ptr + b, token)
    tl.store(token_prob_ptr + b, tl.where(order_key(z) >= min_key, exp_shifted(z, m) * inv_sum.to(tl.float32), 0.0))
    tl.store(entropy_ptr + b, entropy.to(tl.float32))
    tl.store(top1_ptr + b, inv_sum.to(tl.float32))


def draft_step(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               uniforms: torch.Tensor):
    """Same contract as specdec_fast.reference.draft_step_reference; returns a 5-tuple."""
    batch, vocab = logits.shape
    f32 = dict(dtype=torch.float32, device=logits.device)
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device)
    probs = torch.empty(batch, vocab, **f32)
    token_prob, entropy, top1 = (torch.empty(batch, **f32) for _ in range(3))
    if batch:
        draft_step_kernel[(batch,)](
            logits.contiguous(), temperature.contiguous().float(), top_k.contiguous().long(),
            top_p.contiguous().float(), uniforms.contiguous().float(), tokens, probs, token_prob, entropy, top1,
            vocab, BLOCK=TILE, num_warps=8,
        )
    return tokens, probs, token_prob, entropy, top1
