"""Speculative decoding reached from transformers' own ``generate`` through its custom_generate hook:
greedy output equals transformers' greedy decoding with a model draft and with a feature draft
(which transformers' own assisted generation cannot run), padded batches included."""

from __future__ import annotations

import pytest
import torch

from specdec_fast.transformers_generate import CUSTOM_GENERATE

from helpers.models import feature_draft, tiny_llama


def hooked(target, ids, draft, **kwargs) -> torch.Tensor:
    return target.generate(ids, custom_generate=CUSTOM_GENERATE, trust_remote_code=True, assistant_model=draft, **kwargs)


@pytest.mark.parametrize("kind", ["model", "feature"])
def test_greedy_through_generate_is_the_targets_greedy(kind):
    target = tiny_llama(10, vocab=16)
    draft = tiny_llama(11, vocab=16, layers=1) if kind == "model" else feature_draft(target)
    ids = torch.tensor([[3, 1, 4, 1]])
    reference = target.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(hooked(target, ids, draft, max_new_tokens=20, do_sample=False, eos_token_id=()), reference)
    padded, mask = torch.tensor([[0, 0, 3, 1], [2, 7, 1, 5]]), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    reference = target.generate(padded, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    got = hooked(target, padded, draft, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=())
    assert torch.equal(got, reference)


def test_sampling_through_generate_takes_our_seed_and_settings():
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    ids = torch.tensor([[3, 1, 4, 1]])
    runs = [hooked(target, ids, draft, max_new_tokens=12, do_sample=True, temperature=0.8, seed=s, num_draft_tokens=2,
                   eos_token_id=()) for s in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_what_the_hook_cannot_take_is_a_clear_error():
    target = tiny_llama(10, vocab=16)
    with pytest.raises(ValueError, match="needs a draft: pass assistant_model"):
        target.generate(torch.tensor([[1, 2]]), custom_generate=CUSTOM_GENERATE, trust_remote_code=True, max_new_tokens=2)
    with pytest.raises(ValueError, match="repetition_penalty"):
        hooked(target, torch.tensor([[1, 2]]), tiny_llama(11, vocab=16, layers=1), max_new_tokens=2, repetition_penalty=1.3)
