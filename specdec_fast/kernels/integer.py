"""The integer block product: y = x w^T with x quantised to 8 bits per block of 32 and w in Q4_1 /
Q8_0 blocks (kernels/blocks.py), integer dot products per block and the block scales in fp32
(csrc/cpu/integer_linear.h; the arithmetic, step by step, in kernels/reference/integer.py). The
``cpu`` kernel and the reference give the same bits; the CPU kernel's bits are the same on every
instruction set (AVX2, AVX-512, NEON, plain C++), since its integer sums are exact and its fp32
steps run in one fixed order.

This is the lean path's ``q8`` precision (models/lean.py): the model then is the one these numbers
define, no longer the fp32 model its blocks hold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import registry  # noqa: F401  the op's schema
from .backends import resolve
from .blocks import BLOCK, is_blocks
from .reference.integer import integer_linear_reference


def integer_linear(x: Tensor, codes: Tensor, scale: Tensor, backend: str = "auto") -> Tensor:
    """x [M, K] fp32 times block weights (uint8 Q4_1 codes [N, K / 2] with scale [N, K / 32, 2], or
    int8 Q8_0 codes [N, K] with scale [N, K / 32]) in integers -> y [M, N] fp32: the ``cpu`` kernel,
    or the reference for ``backend="torch"`` and where the kernel cannot load."""
    if x.dim() != 2 or x.dtype != torch.float32 or not is_blocks(codes, scale) or x.shape[1] % BLOCK:
        raise ValueError(f"integer_linear takes x [M, K] fp32 (K a multiple of {BLOCK}) and block weights, got x "
                         f"{list(x.shape)} {x.dtype}, codes {list(codes.shape)} {codes.dtype}")
    k = codes.shape[1] * (2 if codes.dtype == torch.uint8 else 1)
    blocks = (len(codes), k // BLOCK) + ((2,) if codes.dtype == torch.uint8 else ())
    if k != x.shape[1] or tuple(scale.shape) != blocks:
        raise ValueError(f"integer_linear: codes {list(codes.shape)} {codes.dtype} need x [M, {k}] and scale {list(blocks)}, "
                         f"got x {list(x.shape)} and scale {list(scale.shape)}")
    if resolve(backend, x.device) == "cpu":
        return torch.ops.specdec_fast.integer_linear(x, codes, scale)
    return integer_linear_reference(x, codes, scale)


def quantize_q8_0(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] float (K a multiple of 32) -> Q8_0 blocks (codes int8 [N, K], scale fp32 [N, K /
    32]) as ggml's reference quantiser makes them: per block d = max|w| / 127, codes w (1 / d) rounded
    half away from zero, d stored as fp16 (the codes of a GGUF Q8_0 file of the same weights)."""
    if weight.dim() != 2 or weight.shape[1] % BLOCK:
        raise ValueError(f"quantize_q8_0 takes [N, K] with K a multiple of {BLOCK}, got {list(weight.shape)}")
    blocks = weight.detach().float().reshape(len(weight), -1, BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    scaled = blocks * torch.where(d > 0, 1 / d, torch.zeros_like(d))
    codes = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    return codes.to(torch.int8).reshape(weight.shape), d[..., 0].to(torch.float16).float()
