"""The decoder-pass op of the lean path (specdec_fast/models/lean.py): one pass of a
Llama-family decoder over M tokens of one or more sequences, keys and values written to a
static cache.

The ``cpu`` backend runs all layers in one OpenMP region (csrc/cpu/decoder.h); elsewhere (CUDA,
or where the kernel cannot load) the pure-torch reference runs the same math. A long prompt takes
:func:`prefill_pass` instead: dense BLAS products and causal attention, faster from ~100 tokens on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import registry  # noqa: F401  the op's schema
from .backends import resolve
from .reference.decoder import decoder_layers, decoder_pass_reference

PREFILL_TOKENS = 128  # a prompt this long takes prefill_pass: 1.3x decoder_pass at 150 tokens, 1.8x at 600 (2-core Xeon)
CONVERTED_PREFILL_TOKENS = 256  # the same over bf16 / int8 weights, converted to fp32 each pass: 1.0x at 200, 1.7x at 600


def decoder_pass(x: Tensor, norms: list[Tensor], weights: list[Tensor], scales: list[Tensor], qkv_bias: list[Tensor],
                 cos: Tensor, sin: Tensor, rows: Tensor, positions: Tensor, slots: Tensor, cache: Tensor, logit_rows: Tensor,
                 heads: int, kv_heads: int, eps: float, integer: bool = False, backend: str = "auto") -> tuple[Tensor, Tensor]:
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
    earlier tokens) and its own slot. integer: every weight is in blocks and takes the tokens'
    activations quantised to 8 bits (kernels/integer.py) instead of the fp32 matrix it holds.
    """
    if resolve(backend, x.device) == "cpu":
        return torch.ops.specdec_fast.decoder_pass(x, norms, weights, scales, qkv_bias, cos, sin, rows, positions, slots,
                                                   cache, logit_rows, heads, kv_heads, eps, integer)
    return decoder_pass_reference(x, norms, weights, scales, qkv_bias, cos, sin, rows, positions, slots, cache, logit_rows,
                                  heads, kv_heads, eps, integer)


def prefill_pass(x: Tensor, norms: list[Tensor], weights: list[Tensor], scales: list[Tensor], qkv_bias: list[Tensor],
                 cos: Tensor, sin: Tensor, row: int, cache: Tensor, heads: int, kv_heads: int, eps: float) -> Tensor:
    """A prompt: the L tokens ``x`` [L, d] at positions 0..L - 1 of sequence ``row``, written to its
    cache slots 0..L - 1; returns their hidden states [L, d] fp32 after the final norm. Arguments
    as :func:`decoder_pass` takes them (cos, sin [L, hd] of positions 0..L - 1).

    Dense products (BLAS) and causal ``scaled_dot_product_attention``: the same math as
    :func:`decoder_pass`, but not its bits (BLAS sums in its own order, which may depend on L).
    The lean path runs a row's first pass here when it starts at position 0 with at least
    ``PREFILL_TOKENS`` tokens, and every loop fills a cache with the prompt but its last token
    first, so every loop computes a prompt's cache to the same bits; each later pass runs
    :func:`decoder_pass`, whose outputs do not depend on the pass size.
    """

    def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        cache[row, layer, 0, :, : len(q)] = k.transpose(0, 1)
        cache[row, layer, 1, :, : len(q)] = v.transpose(0, 1)
        return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                              enable_gqa=True).transpose(0, 1)

    return decoder_layers(x, norms, weights, scales, qkv_bias, cos, sin, heads, kv_heads, eps, attend)
