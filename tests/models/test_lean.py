"""The lean decoder path (specdec_fast/models/lean.py, csrc/cpu/decoder.h): the CPU kernel
against the torch reference, the lean caches against transformers' eager forward (fp32, and
bf16 / int8 against the transformers model with the same rounded weights), a token's logits
independent of the pass it shares, rollback and cache growth, the batch cache against
``BatchedLM``, and which models take the path."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import specdec_fast.models.lean as lean_module
from specdec_fast.kernels.decoder import CONVERTED_PREFILL_TOKENS, PREFILL_TOKENS, decoder_pass, prefill_pass
from specdec_fast.models.batched_lm import BatchedLM, right_aligned
from specdec_fast.models.cached_lm import HFCachedLM
from specdec_fast.models.lean import BatchedLeanLM, LeanLM, LeanPass, cached_lm, lean_precision, lean_unsupported

from helpers.models import tiny_llama, with_weights_read_as

VOCAB = 96


@pytest.fixture(scope="module")
def model():
    return tiny_llama(7, vocab=VOCAB, layers=3, hidden=64, context=1024)


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "q8"])
def test_cpu_kernel_matches_the_reference(model, precision):
    """Two rows at different positions in one pass, one token a sibling (a slot past its position):
    hidden states, logits and the cache agree."""
    lean = LeanPass(model, 2, precision)
    w = lean.w
    tokens, rows = ids(9), torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1])
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 2])
    slots = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3])  # the last token: a sibling of the one before it
    x = w.embed[tokens]
    cos, sin = lean.rotary(x, positions[None])
    out = {}
    for backend in ("cpu", "torch"):
        cache = torch.zeros_like(lean.cache)
        hidden, logits = decoder_pass(x, w.norms, w.weights, w.scales, w.qkv_bias, cos[0], sin[0], rows, positions, slots, cache,
                                      torch.tensor([4, 8, 2]), w.heads, w.kv_heads, w.eps, w.integer, backend=backend)
        out[backend] = hidden, logits, cache
    for a, b in zip(out["cpu"], out["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("prompt", [1, 7, 40])
def test_lean_logits_match_transformers(model, precision, prompt):
    """Passes of 1, 2, 5 and 9 tokens after a prompt: the logits of transformers' eager forward of
    the model with the weights the lean path reads, within 1e-4 (fp32 rounding)."""
    reference, lean = HFCachedLM(with_weights_read_as(model, precision)), LeanLM(model, precision)
    torch.testing.assert_close(lean.extend(ids(prompt), prompt), reference.extend(ids(prompt), prompt), rtol=0, atol=1e-4)
    for n in (1, 2, 5, 9):
        tokens = ids(n, seed=n)
        torch.testing.assert_close(lean.extend(tokens, n), reference.extend(tokens, n), rtol=0, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "q8"])
@pytest.mark.parametrize("size", [6, 9, 13, 16])
def test_a_tokens_logits_do_not_depend_on_the_pass_size(model, size, precision):
    """The kernel sums every output in one order whatever the number of tokens (and however its
    rows split into tiles; attention over 16 keys at a time or one): the logits of a token are
    the same bits in a one-token pass as in a verification pass of 6 to 16 tokens, with fp32
    products and with 8-bit activations."""
    lean = LeanLM(model, precision)
    lean.extend(ids(37), 1)
    tokens = ids(size, seed=3)
    together = lean.extend(tokens, size)
    lean.crop(37)
    alone = torch.cat([lean.extend(t[None], 1) for t in tokens])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_long_prompt_takes_the_prefill_pass_and_a_row_its_own_bits(model, monkeypatch, precision):
    """A prompt of PREFILL_TOKENS (fp32) or CONVERTED_PREFILL_TOKENS (bf16, int8) or more takes
    prefill_pass (the same math as decoder_pass over the same weights, at every precision: logits
    and cache within fp32 rounding); in a batch, a row's
    prompt and the passes after it are the bits it gets alone, beside a short prompt that takes
    decoder_pass."""
    calls = []
    monkeypatch.setattr(lean_module, "prefill_pass", lambda *args: calls.append(len(args[0])) or prefill_pass(*args))
    alone = LeanLM(model, precision)
    long, short = ids(alone.lean.prefill_tokens + 3, seed=1), ids(9, seed=2)
    assert alone.lean.prefill_tokens == (PREFILL_TOKENS if precision == "fp32" else CONVERTED_PREFILL_TOKENS)
    first = alone.extend(long, 2)
    assert calls == [len(long)]
    kernel = LeanLM(model, precision)  # the same prompt in two passes, neither a prompt pass
    kernel.extend(long[:5], 1)
    torch.testing.assert_close(kernel.extend(long[5:], 2), first, rtol=0, atol=1e-4)
    torch.testing.assert_close(kernel.lean.cache[0, ..., : len(long), :], alone.lean.cache[0, ..., : len(long), :], rtol=0, atol=1e-4)
    batch = BatchedLeanLM(model, 2, precision)
    tokens, fed = right_aligned([long.tolist(), short.tolist()])
    together = batch.extend(tokens, fed, 2)
    assert calls == [len(long), len(long)]
    assert torch.equal(together[0], first)
    step = ids(4, seed=5)
    after = batch.extend(torch.stack([step, step]), torch.ones(2, 4, dtype=torch.bool), 4)
    assert torch.equal(after[0], alone.extend(step, 4))
    short_alone = LeanLM(model, precision)
    short_alone.extend(short, 1)
    assert torch.equal(after[1], short_alone.extend(step, 4))


def test_8_bit_activations_take_every_pass_through_the_integer_kernel(model, monkeypatch):
    """With 8-bit activations no prompt takes prefill_pass (its products are fp32 ones): a long
    prompt in one pass gives the bits of the same tokens fed in pieces; the logits are near the
    fp32 model's and not equal to them; the model's fp32 matrices become Q8_0 blocks."""
    monkeypatch.setattr(lean_module, "prefill_pass", lambda *args: pytest.fail("q8 took the prefill pass"))
    whole, pieces, fp32 = LeanLM(model, "q8"), LeanLM(model, "q8"), LeanLM(model, "fp32-dense")
    long = ids(PREFILL_TOKENS + 20, seed=1)
    together = whole.extend(long, 5)
    pieces.extend(long[:100], 1)
    assert torch.equal(pieces.extend(long[100:], 5), together)
    monkeypatch.undo()
    reference = fp32.extend(long, 5)
    assert not torch.equal(together, reference)
    torch.testing.assert_close(together, reference, rtol=0, atol=0.05 * float(reference.abs().max()))
    w = whole.lean.w
    assert w.integer and all(t.dtype == torch.int8 and s.dim() == 2 for t, s in zip(w.weights, w.scales))


def test_rollback_and_growth(model):
    """A crop moves the length only: re-extending gives the logits of a fresh cache; a sequence past
    the initial capacity (256 slots) grows the cache and keeps its earlier slots."""
    lean, fresh = LeanLM(model), LeanLM(model)
    long = ids(300)
    lean.extend(long, 1)
    lean.crop(280)
    torch.testing.assert_close(lean.extend(long[280:], 3), fresh.extend(long, 3), rtol=0, atol=1e-5)
    assert lean.lean.cache.shape[4] == 512 and lean.cache_length == 300
    with pytest.raises(ValueError, match="cannot crop"):
        lean.crop(301)


def test_the_batch_cache_matches_batched_lm(model):
    """Rows of different lengths, holes, keep and select: the logits of transformers' batch cache
    wherever a column is fed (a hole's logits are zeros)."""
    lean, hf = BatchedLeanLM(model, 3), BatchedLM(model, 3)
    prompts = [ids(5).tolist(), ids(9, 1).tolist(), ids(2, 2).tolist()]
    for lm in (lean, hf):
        lm.extend(*right_aligned(prompts), 1)
    steps = [(torch.stack([ids(3, 4), ids(3, 5), ids(3, 6)]), torch.tensor([[1, 1, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool))]
    for tokens, fed in steps:
        a, b = lean.extend(tokens, fed, 3), hf.extend(tokens, fed, 3)
        torch.testing.assert_close(a[fed], b[fed], rtol=0, atol=1e-4)
        assert not a[~fed].any()
    for lm in (lean, hf):
        lm.keep(torch.tensor([6, 10, 4]))
        lm.select(torch.tensor([0, 2]))
    tokens, fed = torch.stack([ids(2, 7), ids(2, 8)]), torch.ones(2, 2, dtype=torch.bool)
    torch.testing.assert_close(lean.extend(tokens, fed, 2), hf.extend(tokens, fed, 2), rtol=0, atol=1e-4)
    assert lean.lengths.tolist() == hf.lengths.tolist() == [8, 6]
    assert lean.valid.sum(1).tolist() == [8, 6] and lean.features.shape == (2, 8, 64)


def test_the_stacked_weights_are_the_models_own(model):
    """No second copy at fp32: q/k/v and gate/up become views of one stack, and the transformers
    model still computes what it did."""
    twin = copy.deepcopy(model)
    before = HFCachedLM(twin).extend(ids(12), 12)
    lean = LeanPass(twin, 1)
    attn = twin.model.layers[0].self_attn
    stack = lean.w.weights[0]
    assert attn.q_proj.weight.data_ptr() == stack.data_ptr()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    assert LeanPass(twin, 1).w is lean.w  # made once per model and precision
    torch.testing.assert_close(HFCachedLM(twin).extend(ids(12), 12), before, rtol=0, atol=0)


def test_which_models_take_the_path(model):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    assert "model_type 'gpt2'" in lean_unsupported(gpt2)
    assert lean_precision(gpt2, "auto") is None and isinstance(cached_lm(gpt2), HFCachedLM)
    with pytest.raises(ValueError, match="cannot take the lean path: model_type 'gpt2'"):
        lean_precision(gpt2, "fp32")
    gelu = tiny_llama(1)
    gelu.config.hidden_act = "gelu"
    assert "hidden_act 'gelu'" in lean_unsupported(gelu)
    assert lean_unsupported(model) is None and lean_precision(model, "auto") == "fp32"
    assert lean_precision(model, "off") is None and lean_precision(model, "int8") == "int8" and lean_precision(model, "q8") == "q8"
    with pytest.raises(ValueError, match="lean must be one of"):
        lean_precision(model, "fp16")


def test_the_kernel_rejects_logit_rows_outside_the_pass(model):
    """A logit row past the pass's tokens (or negative) is an error, not a read out of bounds."""
    lean = LeanPass(model, 1)
    w, tokens = lean.w, ids(3)
    x = w.embed[tokens]
    cos, sin = lean.rotary(x, torch.arange(3)[None])
    for rows in ([3], [-1]):
        with pytest.raises(RuntimeError, match="logit_rows must index the pass's 3 tokens"):
            decoder_pass(x, w.norms, w.weights, w.scales, w.qkv_bias, cos[0], sin[0], torch.zeros(3, dtype=torch.int64),
                         torch.arange(3), torch.arange(3), lean.cache, torch.tensor(rows), w.heads, w.kv_heads, w.eps,
                         backend="cpu")
