"""Draft models: the restricted-vocabulary small draft (lossless with q = 0 outside its
vocabulary), its save/load round trip, and the early-exit draft."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import HFCachedLM, fast_generate
from specdec_fast.drafts.small import RestrictedHead, build_small_draft, early_exit_draft, load_small_draft, save_small_draft

from helpers.distribution import chi_square, sequence_counts
from helpers.models import PROMPT, batched_samples, exact_joint, tiny_llama


def test_restricted_head_puts_minus_inf_outside_its_vocabulary():
    head = RestrictedHead(torch.randn(3, 4), torch.tensor([1, 5, 6]), out_features=8)
    logits = head(torch.randn(2, 4))
    assert logits.shape == (2, 8)
    assert torch.isinf(logits[:, [0, 2, 3, 4, 7]]).all() and torch.isfinite(logits[:, [1, 5, 6]]).all()


@pytest.mark.slow
def test_restricted_draft_is_lossless(tiny_pair):
    """A draft that can only propose 4 of the 8 tokens: the joint of 3 tokens is still the target's
    (5,000 runs through batch_generate, see helpers.models.batched_samples)."""
    target, _ = tiny_pair
    draft = build_small_draft(target, [1], torch.tensor([0, 2, 3, 6]))
    assert HFCachedLM(draft).vocab_size == 8
    seqs = batched_samples(target, draft, PROMPT, 3, 5000, num_draft_tokens=2, temperature=1.0)
    stat, threshold, _ = chi_square(sequence_counts(seqs, 8), exact_joint(target, PROMPT, 3, 1.0, 0, 1.0))
    assert stat < threshold


def test_small_draft_save_load_round_trip(tmp_path):
    target = tiny_llama(3, vocab=16, layers=3)
    draft = build_small_draft(target, [0, 2], torch.arange(0, 16, 2))
    with torch.no_grad():
        draft.lm_head.weight.add_(0.1)  # trained weights differ from the initialisation
    path = tmp_path / "draft.safetensors"
    save_small_draft(draft, path, {"note": "test"})
    loaded = load_small_draft(target, path)
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        a, b = draft(x).logits, loaded(x).logits
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    torch.testing.assert_close(a[finite], b[finite], rtol=1e-2, atol=1e-2)  # stored in fp16
    assert loaded.model.embed_tokens is target.get_input_embeddings()  # shared, not stored


def test_early_exit_draft_shares_weights_and_leaves_target_intact():
    target = tiny_llama(4, vocab=16, layers=4)
    draft = early_exit_draft(target, 2)
    assert len(target.model.layers) == 4 and target.config.num_hidden_layers == 4
    assert len(draft.model.layers) == 2 and draft.model.layers[1] is target.model.layers[1]
    out = fast_generate(target, draft, PROMPT, max_new_tokens=12, temperature=0.0, eos_token_id=())
    assert out.tokens == fast_generate(target, target, PROMPT, max_new_tokens=12, temperature=0.0, eos_token_id=()).tokens




















