"""The skinny linear kernels (fp32 weights for verification passes, int8 weights for drafts)
against their torch references, their row-count invariance, and models switched to them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_fast import fast_generate, generate_autoregressive
from specdec_fast.kernels.linear import MAX_ROWS, linear, quantize_int8, skinny_linear, skinny_linear_int8
from specdec_fast.models.fast_passes import Int8Linear, SkinnyLinear, use_int8_weights, use_skinny_linear

from helpers.models import NO_EOS, tiny_llama


def product(kind: str, x: torch.Tensor, w: torch.Tensor, backend: str) -> torch.Tensor:
    """x @ w^T by the fp32 kernel, or by the int8 kernel with w quantized."""
    if kind == "fp32":
        return skinny_linear(x, w, backend=backend)
    return skinny_linear_int8(x, *quantize_int8(w), backend=backend)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (1536, 576), (576, 1536), (8192, 576), (33, 1000)])
def test_skinny_linear_matches_reference(kind, n, k):
    g = torch.Generator().manual_seed(n + k)
    x, w = torch.randn(MAX_ROWS, k, generator=g), torch.randn(n, k, generator=g) / k**0.5
    int8, scale = quantize_int8(w)
    exact_w = w.double() if kind == "fp32" else int8.double() * scale.double()[:, None]
    exact = x.double() @ exact_w.T
    for rows in range(1, MAX_ROWS + 1):
        out = product(kind, x[:rows], w, "cpu")
        ref = product(kind, x[:rows], w, "torch")
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        # fp32 sums of k products (then one scaling): within a few ulp of the magnitudes summed
        bound = 4 * (k + 1) * torch.finfo(torch.float32).eps * (x[:rows].abs().double() @ exact_w.abs().T)
        assert bool(((out.double() - exact[:rows]).abs() <= bound + 1e-30).all())


def test_int8_quantization_is_within_half_a_step_per_row():
    w = torch.randn(64, 100) * torch.logspace(-3, 2, 64)[:, None]
    w[5] = 0.0
    int8, scale = quantize_int8(w)
    assert int8.dtype == torch.int8 and scale.shape == (64,) and int8.abs().max() == 127
    assert bool(((int8.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all())
    assert not int8[5].any()


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_a_tokens_outputs_do_not_depend_on_the_rows_beside_it(kind):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(MAX_ROWS, 576, generator=g), torch.randn(1536, 576, generator=g)
    full = product(kind, x, w, "cpu")
    for rows in range(1, MAX_ROWS + 1):
        assert torch.equal(product(kind, x[:rows], w, "cpu"), full[:rows])
    for i in range(MAX_ROWS):
        assert torch.equal(product(kind, x[i : i + 1], w, "cpu"), full[i : i + 1])


def test_bad_inputs():
    w = torch.randn(4, 3)
    for x, match in [(torch.randn(2, 4), "x \\[M, K\\]"), (torch.randn(2, 3).double(), "fp32"),
                     (torch.randn(MAX_ROWS + 1, 3), "rows")]:
        with pytest.raises(ValueError, match=match):
            skinny_linear(x, w)
    int8, scale = quantize_int8(w)
    for args, match in [((torch.randn(2, 3), int8, scale[:3]), "scale \\[N\\]"), ((torch.randn(2, 3), w, scale), "int8 weight"),
                        ((torch.randn(MAX_ROWS + 1, 3), int8, scale), "rows")]:
        with pytest.raises(ValueError, match=match):
            skinny_linear_int8(*args)


def test_linear_dispatch_falls_back_where_the_kernel_does_not_apply():
    w = torch.randn(5, 8)
    for x in (torch.randn(3, 2, 8), torch.randn(MAX_ROWS + 1, 8), torch.randn(2, 8).double()):
        torch.testing.assert_close(linear(x, w.to(x.dtype)), F.linear(x, w.to(x.dtype)))
    x = torch.randn(2, 8, requires_grad=True)
    linear(x, w).sum().backward()  # autograd: F.linear
    torch.testing.assert_close(x.grad, w.sum(0).expand(2, 8))


def test_int8_linear_falls_back_to_dequantized_weights():
    w = torch.randn(5, 8)
    layer = Int8Linear(w)
    dequantized = layer.weight.float() * layer.scale[:, None]
    for x in (torch.randn(3, 2, 8), torch.randn(MAX_ROWS + 1, 8), torch.randn(1, 8)):
        torch.testing.assert_close(layer(x), F.linear(x, dequantized))
    x = torch.randn(2, 8, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, dequantized.sum(0).expand(2, 8))


def test_int8_draft_stays_close_and_the_output_exact():
    """use_int8_weights quantizes every linear layer of a draft and its restricted head; its
    logits move by quantization error only, and greedy speculative output still equals the
    target's own (the draft's distribution never changes what verification outputs)."""
    from specdec_fast.drafts.small import build_small_draft

    target = tiny_llama(12, vocab=32)
    draft = build_small_draft(target, [0], torch.arange(0, 32, 2))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = draft(ids).logits
        use_int8_weights(draft)
        after = draft(ids).logits
    assert not any(type(m) is torch.nn.Linear for m in draft.modules())
    assert draft.lm_head.int8 is not None
    finite = before.isfinite()
    assert torch.equal(finite, after.isfinite())
    assert 0 < (after - before)[finite].abs().max() < 0.05 * before[finite].abs().max()
    expected = generate_autoregressive(target, [1, 2, 3], max_new_tokens=30, temperature=0.0, eos_token_id=NO_EOS)
    spec = fast_generate(target, draft, [1, 2, 3], max_new_tokens=30, temperature=0.0, num_draft_tokens=3,
                         eos_token_id=NO_EOS)
    assert spec.tokens == expected.tokens


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
    torch.library.opcheck(torch.ops.specdec_fast.skinny_linear_int8, (torch.randn(5, 64), *quantize_int8(torch.randn(40, 64))))
