"""The loops speak transformers' vocabulary: do_sample, temperature=None, generation_config and the
model's own generation config, max_length, chat messages, BatchEncoding inputs, clear errors for
what the verifier cannot honour, and the decoder classes' outputs."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import BatchEncoding, GenerationConfig

from specdec_fast import ProductionSpeculativeDecoder, batch_generate, default_policy, fast_generate, generate_autoregressive
from specdec_fast.decoding import BatchGenerationOutput
from specdec_fast.policies.monitoring import AdaptiveMonitoringSystem

from helpers.models import NO_EOS, PROMPT, feature_draft, tiny_llama


class ChatTokenizer:
    """A character tokenizer (ids = code % 16) with a chat template, enough to test the plumbing."""

    chat_template = "<user>...</user><assistant>"
    eos_token_id = None

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=True):
        return BatchEncoding({"input_ids": [ord(c) % 16 for c in text]})

    def decode(self, tokens, skip_special_tokens=True):
        return "".join(chr(97 + t) for t in tokens)


@pytest.fixture
def pair():
    return tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)


def tokens(target, draft, **kwargs) -> list[int]:
    return fast_generate(target, draft, PROMPT, max_new_tokens=15, eos_token_id=NO_EOS, seed=3, **kwargs).tokens


def test_greedy_by_default_as_the_generation_config_says(pair):
    target, draft = pair
    greedy = tokens(target, draft, temperature=0.0)
    assert tokens(target, draft) == greedy == tokens(target, draft, do_sample=False) == tokens(target, draft, temperature=None)
    assert tokens(target, draft, do_sample=False, temperature=0.9) == greedy  # do_sample=False wins, as in transformers
    reference = target.generate(torch.tensor([PROMPT]), max_new_tokens=15, do_sample=False, pad_token_id=0)
    assert greedy == reference[0, len(PROMPT):].tolist()


def test_sampling_settings_come_from_the_call_then_the_configs(pair):
    target, draft = pair
    explicit = tokens(target, draft, temperature=0.7, top_k=5, top_p=0.9)
    assert explicit != tokens(target, draft, temperature=0.0)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    assert tokens(target, draft, generation_config=config) == explicit
    assert tokens(target, draft, generation_config=config, temperature=0.0) != explicit  # the call wins
    target.generation_config.update(do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    try:
        assert tokens(target, draft) == explicit  # the model's own generation config
    finally:
        target.generation_config.update(do_sample=None, temperature=None, top_k=None, top_p=None)
    # Sampling with nothing else set anywhere: temperature 1, no top-k, top-p 1.
    assert tokens(target, draft, do_sample=True) == tokens(target, draft, temperature=1.0, top_k=0, top_p=1.0)


def test_budget_from_max_length_or_max_new_tokens(pair):
    target, draft = pair
    out = fast_generate(target, draft, PROMPT, max_length=len(PROMPT) + 6, eos_token_id=NO_EOS)
    assert len(out.tokens) == 6
    default = generate_autoregressive(tiny_llama(10, vocab=16, context=256), PROMPT, eos_token_id=NO_EOS, max_length=None)
    assert len(default.tokens) == 128  # unset anywhere: 128 new tokens (transformers' total of 20 is not ours)


def test_neutral_values_of_unsupported_settings_are_accepted(pair):
    target, draft = pair
    assert tokens(target, draft, repetition_penalty=1.0, num_beams=1) == tokens(target, draft)


def test_chat_messages_and_batch_encodings(pair):
    target, draft = pair
    tok = ChatTokenizer()
    chat = [{"role": "user", "content": "hi there"}]
    ids = tok(tok.apply_chat_template(chat)).input_ids
    by_messages = fast_generate(target, draft, messages=chat, tokenizer=tok, max_new_tokens=8, eos_token_id=NO_EOS)
    assert by_messages.tokens == fast_generate(target, draft, ids, max_new_tokens=8, eos_token_id=NO_EOS).tokens
    encoding = BatchEncoding({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.int64)})
    assert fast_generate(target, draft, encoding, max_new_tokens=8, eos_token_id=NO_EOS).tokens == by_messages.tokens
    # A padded batch as a tokenizer returns it: each row's output is that of its unpadded prompt.
    short = ids[-3:]
    padded = BatchEncoding({"input_ids": torch.tensor([[0] * (len(ids) - 3) + short, ids]),
                            "attention_mask": torch.tensor([[0] * (len(ids) - 3) + [1] * 3, [1] * len(ids)])})
    batch = batch_generate(target, draft, input_ids=padded, max_new_tokens=8, eos_token_id=NO_EOS, seeds=[0, 1])
    alone = batch_generate(target, draft, input_ids=[short, ids], max_new_tokens=8, eos_token_id=NO_EOS, seeds=[0, 1])
    assert [o.tokens for o in batch.outputs] == [o.tokens for o in alone.outputs]
    chats = batch_generate(target, draft, messages=[chat, chat], tokenizer=tok, max_new_tokens=8, eos_token_id=NO_EOS,
                           seeds=[0, 1])
    assert chats.outputs[0].tokens == by_messages.tokens


def test_production_decoder_returns_one_batch_output(pair):
    target, draft = pair
    decoder = ProductionSpeculativeDecoder(target, draft, policy=AdaptiveMonitoringSystem(max_draft_tokens=2), batch_size=2)
    out = decoder.batch_generate(input_ids=[PROMPT, [1, 2], [5]], max_new_tokens=6, seeds=[1, 2, 3], eos_token_id=NO_EOS)
    assert isinstance(out, BatchGenerationOutput) and len(out.outputs) == 3 and out.new_tokens == 18
    assert len(out.draft_lengths) >= 2 * 5 and out.wall_s > 0


def test_monitor_totals_hold_only_what_it_counts():
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=2)
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    out = fast_generate(target, draft, PROMPT, max_new_tokens=12, policy=monitor, eos_token_id=NO_EOS,
                         guard=False)
    totals = monitor.metrics()["totals"]
    assert set(totals) == {"rounds", "drafted", "accepted", "new_tokens", "drafted_at", "accepted_at", "draft_s", "target_s"}
    assert totals["new_tokens"] == out.stats.new_tokens and totals["draft_s"] > 0 and totals["target_s"] > 0


def test_a_policy_learnt_for_another_draft_kind_warns():
    target = tiny_llama(10, vocab=16)
    draft = feature_draft(target)
    with pytest.warns(RuntimeWarning, match="learnt from a token draft and now drafts with a feature draft"):
        fast_generate(target, draft, PROMPT, max_new_tokens=4, policy=default_policy(), eos_token_id=NO_EOS)
    assert default_policy(draft=draft).trained_for == "feature"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast_generate(target, draft, PROMPT, max_new_tokens=4, policy=default_policy(draft=draft), eos_token_id=NO_EOS)


def test_per_request_settings_as_lists_or_tensors(pair):
    target, draft = pair
    common = dict(input_ids=[PROMPT, [1, 2]], max_new_tokens=8, seeds=[5, 6], eos_token_id=NO_EOS)
    as_list = batch_generate(target, draft, temperature=[0.7, 0.0], top_k=[0, 3], **common)
    as_tensor = batch_generate(target, draft, temperature=torch.tensor([0.7, 0.0]), top_k=torch.tensor([0, 3]), **common)
    assert [o.tokens for o in as_list.outputs] == [o.tokens for o in as_tensor.outputs]
    assert as_list.outputs[1].tokens == fast_generate(target, draft, [1, 2], max_new_tokens=8, eos_token_id=NO_EOS).tokens
