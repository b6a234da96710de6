"""Packed grouped-query attention (specdec_fast/attention.py) against transformers' own sdpa:
the same logits for KV-cached passes of every length, one sequence and a left-padded batch;
one-token passes bit for bit; greedy decoding unchanged; other models left alone."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from specdec_fast import batch_generate, fast_generate
from specdec_fast.models.attention import NAME, use_packed_gqa

from helpers.models import tiny_llama


@pytest.fixture(scope="module")
def models():
    """(transformers' sdpa, packed) copies of a tiny Llama with 4 query heads over 2 key/value heads."""
    plain = tiny_llama(3, vocab=64, hidden=64, context=128)
    assert plain.config._attn_implementation == "sdpa" and plain.config.num_key_value_heads == 2
    return plain, use_packed_gqa(copy.deepcopy(plain))


def cached_passes(model, ids: torch.Tensor, mask: torch.Tensor, prefill: int, lengths: list[int]) -> list[torch.Tensor]:
    """Logits of each pass over the next ``lengths`` tokens after a prefill, one growing cache."""
    cache, out, start = DynamicCache(config=model.config), [], prefill
    with torch.no_grad():
        model(input_ids=ids[:, :prefill], attention_mask=mask[:, :prefill], past_key_values=cache)
        for n in lengths:
            out.append(model(input_ids=ids[:, start : start + n], attention_mask=mask[:, : start + n],
                             past_key_values=cache).logits)
            start += n
    return out


@pytest.mark.parametrize("batch", [1, 2])
def test_cached_passes_match_transformers_sdpa(models, batch):
    plain, packed = models
    ids = torch.randint(0, 64, (batch, 60), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    mask[1:, :7] = 0  # the second sequence is left-padded
    lengths = [1, 2, 1, 3, 5, 1, 4, 8]
    passes = [cached_passes(model, ids, mask, 20, lengths) for model in models]
    for a, b in zip(*passes):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    if batch == 1:  # an unmasked prefill and one-token passes take transformers' own path: the same bits
        assert torch.equal(passes[0][0], passes[1][0])


def test_greedy_decoding_is_unchanged(models):
    plain, packed = models
    prompt = torch.tensor([5, 9, 2, 33, 17, 8])
    expected = plain.generate(prompt[None], max_new_tokens=24, do_sample=False, pad_token_id=0)[0, len(prompt):]
    out = fast_generate(packed, copy.deepcopy(packed), prompt, max_new_tokens=24, temperature=0.0, num_draft_tokens=3,
                        eos_token_id=(), guard=False)  # every round drafts (a draft as dear as the target never pays)
    assert out.tokens == expected.tolist()
    assert out.stats.rounds == 6  # every pass verified 3 drafted tokens (4-token packed passes)


def test_batch_generate_is_unchanged(models):
    """Left-padded rows that roll back by different amounts: greedy output as with transformers' sdpa."""
    prompts = [[3, 1, 4, 1, 5, 9, 2], [2], [7, 6, 5, 4, 3, 2, 1, 0, 1, 60, 61], [1, 2]]
    plain_draft = tiny_llama(4, vocab=64, layers=1, hidden=64, context=128)
    outputs = [batch_generate(target, draft, input_ids=prompts, max_new_tokens=16, temperature=0.0, num_draft_tokens=3,
                              eos_token_id=())
               for target, draft in zip(models, (plain_draft, use_packed_gqa(copy.deepcopy(plain_draft))))]
    assert [o.tokens for o in outputs[0].outputs] == [o.tokens for o in outputs[1].outputs]


def test_other_attention_implementations_are_left_alone():
    model = tiny_llama(3, vocab=64, hidden=64)
    model.set_attn_implementation("eager")
    assert use_packed_gqa(model).config._attn_implementation == "eager"
    assert use_packed_gqa(tiny_llama(3, vocab=64, hidden=64)).config._attn_implementation == NAME
