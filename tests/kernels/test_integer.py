"""The integer block product (specdec_fast/kernels/integer.py, csrc/cpu/integer_linear.h): the CPU
kernel gives the reference's bits (Q4_1 and Q8_0 weights, 1 to 17 rows, zero blocks, large and
tiny activations), a row's outputs do not depend on the rows beside it or the threads, the
reference is the arithmetic it states, Q8_0 blocks made on load are ggml's, bad input is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_fast.kernels.blocks import pack_blocks, unpack_blocks
from specdec_fast.kernels.integer import integer_linear, quantize_q8_0
from specdec_fast.kernels.reference.integer import quantize_activations

from helpers.models import gguf_quantized, gguf_roundtrip


def weights(qtype: str, rows: int = 37, cols: int = 192, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) of a random matrix stored as ggml ``qtype`` (odd rows: every tile width)."""
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    return pack_blocks(gguf_roundtrip(w, qtype))


def activations(rows: int, cols: int = 192, seed: int = 1) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0.0  # a block of zeros: d = 0
    if rows > 2:
        x[2] *= 1e4  # large and tiny blocks: the scale follows each block
        x[1, 32:64] *= 1e-6
    return x


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 10, 16, 17])
def test_the_kernel_gives_the_references_bits(qtype, rows):
    codes, scale = weights(qtype)
    x = activations(rows)
    assert torch.equal(integer_linear(x, codes, scale, backend="cpu"), integer_linear(x, codes, scale, backend="torch"))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it(qtype, threads):
    codes, scale = weights(qtype, rows=300)
    x = activations(16)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = integer_linear(x, codes, scale, backend="cpu")
        for rows in (1, 2, 5, 9, 13):
            assert torch.equal(integer_linear(x[:rows], codes, scale, backend="cpu"), full[:rows])
        for i in range(16):
            assert torch.equal(integer_linear(x[i: i + 1], codes, scale, backend="cpu"), full[i: i + 1])
    finally:
        torch.set_num_threads(before)


def test_activations_are_quantised_per_block_of_32():
    """d = max|x| / 127 per block, codes rounded half to even within -127..127, s = d * sum(codes)."""
    x = torch.zeros(1, 64)
    x[0, :4] = torch.tensor([127.0, -63.5, 0.5, 1.5])  # d = 1: -63.5 -> -64, 0.5 -> 0, 1.5 -> 2
    q, d, s = quantize_activations(x)
    assert d.tolist() == [[1.0, 0.0]] and q[0, :4].tolist() == [127, -64, 0, 2] and not q[0, 4:].any()
    assert s.tolist() == [[127.0 - 64 + 2, 0.0]]


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_the_product_is_the_fp32_product_of_the_quantised_activations(qtype):
    """The integer product equals (dequantised activations) @ (dequantised weights)^T up to fp32
    rounding of the block sums, and is near the fp32 product of the activations themselves
    (8-bit activations: about 1% of the output's size)."""
    codes, scale = weights(qtype)
    x = torch.randn(5, 192, generator=torch.Generator().manual_seed(3))
    q, d, _ = quantize_activations(x)
    dequantised = (q.double().view(5, -1, 32) * d.double()[..., None]).view(5, -1)
    w = unpack_blocks(codes, scale).double()
    y = integer_linear(x, codes, scale, backend="cpu").double()
    torch.testing.assert_close(y, dequantised @ w.T, rtol=0, atol=1e-5)
    error = (y - x.double() @ w.T).abs().max() / (x.double() @ w.T).abs().max()
    assert 1e-4 < error < 0.03


def test_q8_0_blocks_made_on_load_are_ggmls():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(4)) * torch.logspace(-3, 1, 64)[:, None]
    w[3] = 0.0
    codes, scale = quantize_q8_0(w)
    theirs = gguf_quantized(w, "Q8_0").reshape(64, -1, 34)  # per block: fp16 d, 32 int8 codes
    assert torch.equal(scale, torch.from_numpy(theirs[..., :2].copy().view(np.float16).astype(np.float32))[..., 0])
    assert torch.equal(codes, torch.from_numpy(theirs[..., 2:].copy().view(np.int8)).reshape(64, -1))


def test_bad_input_is_refused_with_the_reason():
    codes, scale = weights("Q4_1")
    with pytest.raises(ValueError, match="block weights"):
        integer_linear(torch.randn(2, 192), torch.randn(37, 192), scale)
    with pytest.raises(ValueError, match=r"need x \[M, 192\]"):
        integer_linear(torch.randn(2, 96), codes, scale)
    with pytest.raises(ValueError, match="fp32"):
        integer_linear(torch.randn(2, 192).double(), codes, scale)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(torch.randn(4, 40))
