"""Block weights (specdec_fast/kernels/blocks.py, csrc/cpu/skinny_linear.h): a matrix that a GGUF
loader dequantised from Q4_1 or Q8_0 is found and packed so that its codes give back every value
bit for bit; anything else is left alone; the decoder pass over packed weights gives the bits of
the pass over the fp32 matrices, on the CPU kernel and in the reference."""

from __future__ import annotations

import pytest
import torch

from specdec_fast.kernels.blocks import pack_blocks, unpack_blocks
from specdec_fast.kernels.decoder import decoder_pass
from specdec_fast.models.lean import LeanWeights

from helpers.models import as_gguf, gguf_roundtrip, tiny_llama


def matrix(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("qtype, codes_dtype, scale_shape", [("Q4_1", torch.uint8, (40, 6, 2)), ("Q8_0", torch.int8, (40, 6))])
def test_a_gguf_dequantised_matrix_is_packed_exactly(qtype, codes_dtype, scale_shape):
    weight = gguf_roundtrip(matrix(40, 192), qtype)
    codes, scale = pack_blocks(weight)
    assert codes.dtype == codes_dtype and tuple(scale.shape) == scale_shape
    assert torch.equal(unpack_blocks(codes, scale), weight)


def test_q4_1_codes_sit_in_ggml_nibble_order():
    """Byte j of a block holds element j (low nibble) and element j + 16 (high)."""
    weight = gguf_roundtrip(matrix(1, 32), "Q4_1")
    codes, scale = pack_blocks(weight)
    d, m = scale[0, 0]
    q = torch.cat([codes[0] & 15, codes[0] >> 4]).float()
    assert torch.equal(d * q + m, weight[0])


@pytest.mark.parametrize("make", [
    lambda: matrix(40, 192),                                                   # an fp32 model's weights
    lambda: matrix(40, 200),                                                   # columns not in whole blocks
    lambda: gguf_roundtrip(matrix(40, 192), "Q4_1").index_put_(                # one value off by one ulp
        (torch.tensor([17]), torch.tensor([5])), torch.nextafter(gguf_roundtrip(matrix(40, 192), "Q4_1")[17, 5], torch.tensor(1.0))),
    lambda: gguf_roundtrip(matrix(40, 192), "Q4_1").double(),                  # not fp32
], ids=["fp32", "ragged", "one-ulp-off", "float64"])
def test_anything_else_is_left_alone(make):
    assert pack_blocks(make()) is None


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("size", [1, 2, 5, 7, 9, 12])
def test_the_decoder_pass_over_blocks_gives_the_fp32_bits(qtype, backend, size):
    """Packed weights and the fp32 matrices they hold, one pass of 1 to 12 tokens (two sequences
    from 5 on): the same hidden states, logits and cache, bit for bit (the kernel dequantises Q4_1 in
    registers up to 9 tokens, in tiles 4, 3 or 2 weight rows wide, else into a buffer for its fp32
    tiles; the reference unpacks)."""
    model = as_gguf(tiny_llama(3, vocab=96, layers=2, hidden=64, context=64), qtype)
    packed, dense = LeanWeights.of(model, "fp32"), LeanWeights.of(model, "fp32-dense")
    assert all(w.dtype in (torch.uint8, torch.int8) for w in packed.weights) and not dense.scales
    first = (size + 1) // 2
    tokens, rows = torch.arange(size), (torch.arange(size) >= first).long()
    positions = torch.cat([torch.arange(first), torch.arange(size - first)])
    x = packed.embed[tokens]
    cos, sin = model.model.rotary_emb(x, positions[None])
    out = []
    for w in (packed, dense):
        cache = torch.zeros(2, 2, 2, w.kv_heads, 16, w.head_dim)
        out.append((*decoder_pass(x, w.norms, w.weights, w.scales, w.qkv_bias, cos[0], sin[0], rows, positions, positions, cache,
                                  torch.tensor([0, size - 1]), w.heads, w.kv_heads, w.eps, backend=backend), cache))
    for a, b in zip(*out):
        assert torch.equal(a, b)
