"""Weights stored in blocks of 32: fp32 matrices that are exactly ggml Q4_1 or Q8_0 dequantisations.

A model loaded from a quantised GGUF file (the default target: SmolLM2-135M-Instruct, Q4_1
layers and a Q8_0 embedding) holds fp32 weights that are each ``fl(fl(d q) + m)`` (Q4_1: a 4-bit
code q and fp16 d, m per block of 32) or ``fl(d q)`` (Q8_0: an int8 code, an fp16 d per block):
the loader's own arithmetic. :func:`pack_blocks` finds such a matrix and returns its codes and
scales, checked to reproduce every value bit for bit, so the lean pass reads 6 (Q4_1: 4-bit
codes and fp32 d, m per 32) or 9 (Q8_0) bits per weight instead of 32 and computes with the same fp32 numbers
(csrc/cpu/skinny_linear.h: ``skinny_linear_blocks``). A matrix that is not such a dequantisation
(any model trained or loaded in fp32) is left alone; that check stops at its first block group.

Layout (what ``decoder_pass`` takes): Q4_1 codes uint8 [N, K / 2] (byte j of a block: element j
in the low nibble, j + 16 in the high one) with scale fp32 [N, K / 32, 2] (d, m); Q8_0 codes int8
[N, K] with scale fp32 [N, K / 32].
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32
_SAMPLE_ROWS = 8  # rows tried first, so a matrix that is not in blocks costs next to nothing
_NEIGHBOURS = (0, -1, 1, -2, 2)  # fp16 steps around the estimated d
_PIECE_ROWS = 4096  # rows fitted at a time (bounds the temporaries: ~40 MB per piece of 576 columns)


def _fp16_candidates(estimate: Tensor) -> list[Tensor]:
    """fp32 copies of the fp16 value nearest ``estimate`` and of its neighbours (by bit steps)."""
    bits = estimate.to(torch.float16).view(torch.int16)
    return [(bits + step).view(torch.float16).float() for step in _NEIGHBOURS]


def _fit(blocks: Tensor, low: Tensor, levels: int, offset: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(codes, d) with ``d * codes (+ offset) == blocks`` for every block [n, 32], trying fp16 d
    near ``(max - low) / levels``; None if some block has no such d."""
    base = blocks if offset is None else blocks - offset[:, None]
    top = blocks.amax(1) if offset is not None else blocks.abs().amax(1)
    codes, scale = torch.zeros_like(blocks), torch.zeros_like(low)
    todo = torch.ones(len(blocks), dtype=torch.bool)
    for d in _fp16_candidates((top - low) / levels):
        q = torch.where(d[:, None] != 0, torch.round(base / d[:, None]), torch.zeros_like(blocks))
        made = d[:, None] * q
        if offset is not None:
            made = made + offset[:, None]
        lo, hi = (0, levels) if offset is not None else (-128, 127)
        fits = todo & (made == blocks).all(1) & (q >= lo).all(1) & (q <= hi).all(1)
        codes[fits], scale[fits] = q[fits], d[fits]
        todo &= ~fits
        if not todo.any():
            return codes, scale
    return None


def _q8_0(blocks: Tensor) -> tuple[Tensor, Tensor] | None:
    found = _fit(blocks, torch.zeros(len(blocks)), 127, None)
    return None if found is None else (found[0].to(torch.int8), found[1])


def _q4_1(blocks: Tensor) -> tuple[Tensor, Tensor] | None:
    low = blocks.amin(1)
    if not torch.equal(low.to(torch.float16).float(), low):  # m is fp16 and the smallest value (code 0)
        return None
    found = _fit(blocks, low, 15, low)
    if found is None:
        return None
    q = found[0].to(torch.uint8).view(-1, 2, BLOCK // 2)
    return (q[:, 0] | (q[:, 1] << 4)), torch.stack([found[1], low], -1)


_FORMATS = (_q4_1, _q8_0)


def pack_blocks(weight: Tensor) -> tuple[Tensor, Tensor] | None:
    """(codes, scale) of ``weight`` [N, K] fp32 (CPU) in the first format of Q4_1, Q8_0 that
    reproduces every value exactly (see the module docstring for the layout); None if neither
    does, or K is not a multiple of 32."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[1] % BLOCK or weight.device.type != "cpu":
        return None
    rows, k = weight.shape
    w = weight.detach()
    for fmt in _FORMATS:
        if fmt(w[:_SAMPLE_ROWS].reshape(-1, BLOCK)) is None:
            continue
        found = [fmt(part.reshape(-1, BLOCK)) for part in w.split(_PIECE_ROWS)]
        if all(f is not None for f in found):
            codes, scale = (torch.cat(parts) for parts in zip(*found))
            return codes.reshape(rows, -1), scale.reshape(rows, k // BLOCK, -1).squeeze(-1).contiguous()
    return None


def block_codes(codes: Tensor) -> Tensor:
    """Block codes -> their integer values [N, K / 32, 32] (int16) in element order: Q4_1 (uint8
    [N, K / 2], byte j of a block holding elements j and j + 16) as 0..15, Q8_0 (int8 [N, K]) as they are."""
    if codes.dtype == torch.uint8:
        halves = codes.reshape(len(codes), -1, BLOCK // 2)
        return torch.cat([halves & 15, halves >> 4], -1).to(torch.int16)
    return codes.reshape(len(codes), -1, BLOCK).to(torch.int16)


def unpack_blocks(codes: Tensor, scale: Tensor) -> Tensor:
    """The fp32 matrix [N, K] of block weights (the reference of the kernel's dequantisation):
    Q4_1 (uint8 codes) ``d * q + m``, Q8_0 (int8 codes) ``d * q``. ``d * q`` is exact in fp32 (an
    fp16 d times a 4- or 8-bit code), so each value has the one rounding of the GGUF loaders."""
    q = block_codes(codes).float()
    if codes.dtype == torch.uint8:
        return (scale[..., 0, None] * q + scale[..., 1, None]).reshape(len(codes), -1)
    return (scale[..., None] * q).reshape(len(codes), -1)


def is_blocks(weight: Tensor, scale: Tensor | None) -> bool:
    """Whether (weight, scale) is a block matrix (uint8 Q4_1 codes, or int8 codes with a scale per block)."""
    return weight.dtype == torch.uint8 or (weight.dtype == torch.int8 and scale is not None and scale.dim() == 2)
