"""The reference of one Llama-family decoder pass (``decoder_pass``), in plain torch ops on any
device: what csrc/cpu/decoder.h computes, written for reading, and the lean path's pass where
the CPU kernel does not run (CUDA)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..blocks import is_blocks, unpack_blocks
from .integer import integer_linear_reference


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x [..., d] * rsqrt(mean(x^2) + eps) * weight [d] (transformers' LlamaRMSNorm, fp32)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x [M, heads, hd] with cos, sin [M, hd]: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    return x * cos[:, None] + torch.cat([-x[..., half:], x[..., :half]], -1) * sin[:, None]


def weight_linear(x: Tensor, weight: Tensor, scale: Tensor | None, integer: bool = False) -> Tensor:
    """x [M, in] fp32 @ weight [out, in]^T: fp32, bf16 read exactly as fp32, int8 times scale [out],
    or block weights (kernels/blocks.py) as the fp32 matrix they hold, or (integer) against x
    quantised to 8 bits (kernels/integer.py). scale None or empty: none."""
    scale = scale if scale is not None and scale.numel() else None
    if integer:
        if not is_blocks(weight, scale):
            raise ValueError(f"8-bit activations need block weights, got {weight.dtype} {list(weight.shape)}")
        return integer_linear_reference(x, weight, scale)
    if is_blocks(weight, scale):
        return F.linear(x, unpack_blocks(weight, scale))
    y = F.linear(x, weight.float())
    return y if scale is None else y * scale


def decoder_layers(x: Tensor, norms: list[Tensor], weights: list[Tensor], scales: list[Tensor],
                   qkv_bias: list[Tensor], cos: Tensor, sin: Tensor, heads: int, kv_heads: int, eps: float,
                   attend: Callable[[int, Tensor, Tensor, Tensor], Tensor], integer: bool = False) -> Tensor:
    """x [M, d] through every layer (arguments as :func:`decoder_pass_reference` takes them);
    ``attend(layer, q [M, H, hd], k [M, Hkv, hd], v [M, Hkv, hd])`` stores the keys and values and
    returns the attention output [M, H, hd]. Returns the hidden states [M, d] after the final norm."""
    layers, hd = (len(norms) - 1) // 2, cos.shape[-1]

    def linear(x: Tensor, i: int) -> Tensor:
        return weight_linear(x, weights[i], scales[i] if scales else None, integer)

    for layer in range(layers):
        qkv = linear(rms_norm(x, norms[2 * layer], eps), 4 * layer)
        if qkv_bias:
            qkv = qkv + qkv_bias[layer]
        qkv = qkv.view(len(x), heads + 2 * kv_heads, hd)
        q, k = rotate(qkv[:, :heads], cos, sin), rotate(qkv[:, heads: heads + kv_heads], cos, sin)
        attn = attend(layer, q, k, qkv[:, heads + kv_heads:])
        x = x + linear(attn.reshape(len(x), -1), 4 * layer + 1)
        gate, up = linear(rms_norm(x, norms[2 * layer + 1], eps), 4 * layer + 2).chunk(2, -1)
        x = x + linear(F.silu(gate) * up, 4 * layer + 3)
    return rms_norm(x, norms[-1], eps)


def decoder_pass_reference(x: Tensor, norms: list[Tensor], weights: list[Tensor], scales: list[Tensor],
                           qkv_bias: list[Tensor], cos: Tensor, sin: Tensor, rows: Tensor, positions: Tensor,
                           slots: Tensor, cache: Tensor, logit_rows: Tensor, heads: int, kv_heads: int,
                           eps: float, integer: bool = False) -> tuple[Tensor, Tensor]:
    """One pass over M tokens (see :func:`specdec_fast.kernels.decoder.decoder_pass` for the
    arguments): writes the tokens' keys and values to ``cache`` and returns (hidden [M, d] after
    the final norm, logits [R, V] of hidden[logit_rows])."""

    def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        cache[rows, layer, 0, :, slots] = k
        cache[rows, layer, 1, :, slots] = v
        attn = torch.empty_like(q)
        for m in range(len(q)):  # token m sees its row's slots 0..positions[m] - 1 and its own slot
            seen = torch.cat([torch.arange(int(positions[m]), device=q.device), slots[m: m + 1]])
            keys = cache[rows[m], layer, 0][:, seen].repeat_interleave(heads // kv_heads, 0)
            values = cache[rows[m], layer, 1][:, seen].repeat_interleave(heads // kv_heads, 0)
            attn[m] = F.scaled_dot_product_attention(q[m][:, None], keys, values)[:, 0]
        return attn

    hidden = decoder_layers(x, norms, weights, scales, qkv_bias, cos, sin, heads, kv_heads, eps, attend, integer)
    return hidden, weight_linear(hidden[logit_rows], weights[-1], scales[-1] if scales else None, integer)
