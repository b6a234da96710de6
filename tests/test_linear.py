"""The skinny linear kernel (verification passes on the CPU) against F.linear, its
row-count invariance, and models switched to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_fast import fast_generate, generate_autoregressive
from specdec_fast.linear import MAX_ROWS, SkinnyLinear, linear, skinny_linear, use_skinny_linear

from conftest import tiny_llama
from test_generate import NO_EOS


@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (1536, 576), (576, 1536), (8192, 576), (33, 1000)])
def test_skinny_linear_matches_reference(n, k):
    g = torch.Generator().manual_seed(n + k)
    x, w = torch.randn(MAX_ROWS, k, generator=g), torch.randn(n, k, generator=g) / k**0.5
    exact = x.double() @ w.double().T
    for rows in range(1, MAX_ROWS + 1):
        out = skinny_linear(x[:rows], w, backend="cpu")
        ref = skinny_linear(x[:rows], w, backend="torch")
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        # fp32 sums of k products: error within a few ulp of the magnitudes summed
        bound = 4 * k * torch.finfo(torch.float32).eps * (x[:rows].abs().double() @ w.abs().double().T)
        assert bool(((out.double() - exact[:rows]).abs() <= bound + 1e-30).all())


def test_a_tokens_outputs_do_not_depend_on_the_rows_beside_it():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(MAX_ROWS, 576, generator=g), torch.randn(1536, 576, generator=g)
    full = skinny_linear(x, w, backend="cpu")
    for rows in range(1, MAX_ROWS + 1):
        assert torch.equal(skinny_linear(x[:rows], w, backend="cpu"), full[:rows])
    for i in range(MAX_ROWS):
        assert torch.equal(skinny_linear(x[i : i + 1], w, backend="cpu"), full[i : i + 1])


def test_bad_inputs():
    w = torch.randn(4, 3)
    for x, match in [(torch.randn(2, 4), "x \\[M, K\\]"), (torch.randn(2, 3).double(), "fp32"),
                     (torch.randn(MAX_ROWS + 1, 3), "rows")]:
        with pytest.raises(ValueError, match=match):
            skinny_linear(x, w)


def test_linear_dispatch_falls_back_where_the_kernel_does_not_apply():
    w = torch.randn(5, 8)
    for x in (torch.randn(3, 2, 8), torch.randn(MAX_ROWS + 1, 8), torch.randn(2, 8).double()):
        torch.testing.assert_close(linear(x, w.to(x.dtype)), F.linear(x, w.to(x.dtype)))
    x = torch.randn(2, 8, requires_grad=True)
    linear(x, w).sum().backward()  # autograd: F.linear
    torch.testing.assert_close(x.grad, w.sum(0).expand(2, 8))


def test_switched_model_generates_the_same_greedy_text():
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    before = generate_autoregressive(target, [1, 2, 3], max_new_tokens=30, temperature=0.0, eos_token_id=NO_EOS)
    use_skinny_linear(target)
    use_skinny_linear(draft)
    assert any(isinstance(m, SkinnyLinear) for m in target.modules())
    assert sum(1 for _ in target.parameters()) == sum(1 for _ in tiny_llama(10, vocab=16).parameters())
    after = generate_autoregressive(target, [1, 2, 3], max_new_tokens=30, temperature=0.0, eos_token_id=NO_EOS)
    spec = fast_generate(target, draft, [1, 2, 3], max_new_tokens=30, temperature=0.0, num_draft_tokens=3,
                         eos_token_id=NO_EOS)
    assert after.tokens == before.tokens == spec.tokens


def test_opcheck():
    skinny_linear(torch.randn(1, 4), torch.randn(3, 4), backend="cpu")  # loads the cpu library
    torch.library.opcheck(torch.ops.specdec_fast.skinny_linear, (torch.randn(5, 64), torch.randn(40, 64)))
