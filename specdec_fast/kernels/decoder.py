"""The decoder-pass op of the lean path (specdec_fast/models/lean.py): one pass of a
Llama-family decoder over M tokens of one or more sequences, keys and values written to a
static cache.

The ``cpu`` backend runs all layers in one OpenMP region (csrc/cpu/decoder.h); elsewhere (CUDA,
or where the kernel cannot load) the pure-torch reference runs the same math.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import registry  # noqa: F401  the op's schema
from .backends import resolve
from .reference.decoder import decoder_pass_reference


def decoder_pass(x: Tensor, norms: list[Tensor], weights: list[Tensor], scales: list[Tensor], qkv_bias: list[Tensor],
                 cos: Tensor, sin: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, cache: Tensor, logit_rows: Tensor,
                 heads: int, kv_heads: int, eps: float, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """One decoder pass over M tokens; returns (hidden [M, d] fp32 after the final norm, logits
    [R, V] fp32 of the rows ``logit_rows`` [R] int64 of hidden).

    x [M, d] fp32: the tokens' embeddings. norms: 2 L + 1 fp32 [d] (each layer's attention and MLP
    norm, then the final norm). weights: 4 L + 1 matrices of one dtype, fp32, bf16 or int8 (each
    layer's stacked q/k/v [(H + 2 Hkv) hd, d], o [d, H hd], stacked gate/up [2 I, d], down [d, I],
    then the head [V, d]); scales: one fp32 [out] per weight for int8, else empty. qkv_bias: L
    fp32 [(H + 2 Hkv) hd] or empty. cos, sin [M, hd] fp32: the rotary tables of the tokens'
    positions. rows, positions, slots [M] int64: token m is at ``positions[m]`` of sequence
    ``rows[m]``; it writes slot ``slots[m]`` (>= its position; usually equal) of ``cache`` [B, L, 2,
    Hkv, capacity, hd] fp32 and attends to the row's slots 0..positions[m] - 1 (which hold its
    earlier tokens) and its own slot.
    """
    if resolve(backend, x.device) == "cpu":
        return torch.ops.specdec_fast.decoder_pass(x, norms, weights, scales, qkv_bias, cos, sin, rows, positions, slots,
                                                   cache, logit_rows, heads, kv_heads, eps)
    return decoder_pass_reference(x, norms, weights, scales, qkv_bias, cos, sin, rows, positions, slots, cache, logit_rows,
                                  heads, kv_heads, eps)
