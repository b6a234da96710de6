"""The lean path on the real target, SmolLM2-135M-Instruct: logits against transformers' eager
forward over a grid of prompt lengths and pass sizes (fp32, and bf16 / int8 against the model
with the same rounded weights), and greedy decoding equal to transformers' ``generate`` on the
held-out chat prompts; with 8-bit activations, the checkpoint's own blocks and greedy speculation
equal to greedy decoding."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import PromptLookup, fast_generate, generate_autoregressive
from specdec_fast.data.prompts import heldout_prompts
from specdec_fast.decoding.requests import chat_prompt_ids
from specdec_fast.models.cached_lm import HFCachedLM
from specdec_fast.models.lean import LeanLM, LeanWeights

from helpers.models import with_weights_read_as

pytestmark = pytest.mark.slow  # the real 135M-parameter model

TOLERANCE = 5e-4  # logits of magnitude ~30: fp32 sums in another order differ by ~1e-4


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_logits_match_transformers_over_prompt_lengths_and_pass_sizes(smollm2, precision):
    model, tokenizer = smollm2
    reference = model if precision == "fp32" else with_weights_read_as(model, precision)
    text = tokenizer(" ".join(p["prompt"] for p in heldout_prompts()[:8]), return_tensors="pt").input_ids[0]
    for prompt in (1, 9, 70):
        ours, theirs = LeanLM(model, precision), HFCachedLM(reference)
        torch.testing.assert_close(ours.extend(text[:prompt], prompt), theirs.extend(text[:prompt], prompt),
                                   rtol=0, atol=TOLERANCE)
        start = prompt
        for n in (1, 2, 5):
            chunk = text[start: start + n]
            torch.testing.assert_close(ours.extend(chunk, n), theirs.extend(chunk, n), rtol=0, atol=TOLERANCE)
            start += n


def test_greedy_equals_transformers_generate_on_the_heldout_prompts(smollm2):
    """Token for token on 9 held-out chat prompts (up to 48 tokens or EOS; transformers' min_new_tokens
    would suppress EOS, so neither runs past it). A flip is allowed only at a near-tie of
    transformers' own top two logits (margin < 1e-3), and reported."""
    model, tokenizer = smollm2
    flips = []
    for p in heldout_prompts()[::4]:
        ids = chat_prompt_ids(tokenizer, p["prompt"])
        ours = generate_autoregressive(model, ids, max_new_tokens=48, temperature=0.0).tokens  # both stop at EOS
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48, do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
        theirs = out.sequences[0, len(ids):].tolist()
        if ours != theirs:
            i = next(j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            top2 = out.scores[i][0].topk(2).values
            flips.append((p["prompt"][:40], i, float(top2[0] - top2[1])))
    assert all(margin < 1e-3 for *_, margin in flips), f"greedy flips that are not near-ties: {flips}"
    assert len(flips) <= 1, f"flips (prompt, position, transformers' top-2 logit margin): {flips}"


def test_the_q4_1_checkpoint_is_read_from_its_blocks_with_the_fp32_bits(smollm2):
    """The default target was dequantised from a Q4_1 GGUF (a Q8_0 embedding): every matrix of the
    lean pass is found in blocks, and a prompt pass, one token and nine give the logits of the fp32
    matrices bit for bit."""
    model, tokenizer = smollm2
    packed, dense = LeanWeights.of(model, "fp32"), LeanWeights.of(model, "fp32-dense")
    assert [w.dtype for w in packed.weights] == [torch.uint8] * (len(packed.weights) - 1) + [torch.int8]
    assert sum(t.numel() * t.element_size() for t in packed.weights + packed.scales) < sum(
        t.numel() * t.element_size() for t in dense.weights) / 4
    text = tokenizer(" ".join(p["prompt"] for p in heldout_prompts()[:20]), return_tensors="pt").input_ids[0]
    assert len(text) >= 150
    ours, theirs = LeanLM(model), LeanLM(model, "fp32-dense")
    for start, n in ((0, 140), (140, 1), (141, 9)):
        assert torch.equal(ours.extend(text[start: start + n], n), theirs.extend(text[start: start + n], n))


def test_8_bit_activations_read_the_checkpoints_blocks_and_keep_greedy_exact(smollm2):
    """lean="q8" takes the Q4_1 / Q8_0 codes the checkpoint was dequantised from (no second
    quantisation), and speculative greedy decoding at that precision (a prompt lookup, drafts of
    up to 8 tokens) equals its own autoregressive greedy decoding, token for token."""
    model, tokenizer = smollm2
    blocks, integer = LeanWeights.of(model, "fp32"), LeanWeights.of(model, "q8")
    assert integer.integer and all(torch.equal(a, b) for a, b in zip(integer.weights + integer.scales, blocks.weights + blocks.scales))
    for p in heldout_prompts()[1::8]:
        ids = chat_prompt_ids(tokenizer, p["prompt"])
        expected = generate_autoregressive(model, ids, max_new_tokens=48, temperature=0.0, lean="q8").tokens
        ours = fast_generate(model, PromptLookup(), ids, max_new_tokens=48, temperature=0.0, num_draft_tokens=8, lean="q8",
                             guard=False)
        assert ours.tokens == expected
