"""The reference of the integer block product (csrc/cpu/integer_linear.h): activations quantised
to 8 bits per block of 32, integer dot products against Q4_1 / Q8_0 weight codes, block scales
applied in fp32 in a fixed order. Plain torch ops on any device, bit for bit the kernel's numbers
(the order of every fp32 operation is the kernel's; the integer sums are exact in float64)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..blocks import BLOCK, block_codes

LANES = 8  # a block's dot product in 8 lanes of 4 consecutive elements


def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x [M, K] fp32 (K a multiple of 32) -> (q [M, K] int8, d [M, K / 32] fp32, s [M, K / 32] fp32):
    per block of 32, d = max|x| / 127, q = round-half-even(x / d) clamped to -127..127 (0 where d
    = 0), s = d * sum(q)."""
    blocks = x.reshape(len(x), -1, BLOCK)
    d = blocks.abs().amax(-1) / 127
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.where(d[..., None] > 0, torch.round((blocks / safe[..., None]).clamp(-127, 127)), torch.zeros_like(blocks))
    return q.to(torch.int8).reshape(x.shape), d, d * q.sum(-1)


def integer_linear_reference(x: Tensor, codes: Tensor, scale: Tensor) -> Tensor:
    """x [M, K] fp32 against block weights (codes uint8 Q4_1 [N, K / 2] with scale [N, K / 32, 2] (d,
    m), or int8 Q8_0 [N, K] with scale [N, K / 32]) -> y [M, N] fp32, as integer_linear.h computes it."""
    q, dx, sx = quantize_activations(x)
    w = block_codes(codes)
    rows, blocks = len(x), w.shape[1]
    # lanes[b, l] = q (rows, 4) @ w (4, N): the int32 sums, exact in float64
    a = q.reshape(rows, blocks, LANES, 4).permute(1, 2, 0, 3).double()
    lanes = a @ w.reshape(len(w), blocks, LANES, 4).permute(1, 2, 3, 0).double()  # [blocks, 8, M, N]
    d = scale[..., 0] if codes.dtype == torch.uint8 else scale
    acc = torch.zeros(LANES, rows, len(w), dtype=torch.float32, device=x.device)
    for b in range(blocks):
        acc = acc + lanes[b].float() * (d[:, b][None] * dx[:, b][:, None])
    y = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
    if codes.dtype == torch.uint8:
        off = torch.zeros_like(y)
        for b in range(blocks):
            off = off + scale[:, b, 1][None] * sx[:, b][:, None]
        y = y + off
    return y
