"""The prompt-lookup draft (specdec_fast/drafts/lookup.py): lossless at every temperature, top-k and
top-p (the exact joint of the first tokens, with a negative control), greedy equal to the target's
greedy decoding in both loops, proposals that come from the context, and the errors it raises."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import batch_generate, fast_generate, generate_autoregressive
from specdec_fast.drafts.lookup import LookupCorpus, LookupLM, PromptLookup
from specdec_fast.kernels.lookup import LookupIndex

from helpers.distribution import chi_square, sequence_counts
from helpers.models import NO_EOS, batched_samples, exact_joint, tiny_llama

REPEATING = [3, 1, 4, 1, 5, 1, 4]  # "1 4" and "1" recur: the lookup has something to propose from the first round


def corpus_of(tokens: list[int], learn: bool = False) -> LookupCorpus:
    corpus = LookupCorpus(max_n=3, capacity=1 << 10, learn=learn)
    corpus.add(tokens)
    return corpus


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,verifier,corpus", [(1.0, 0, 1.0, "token", False),
                                                                     (0.8, 6, 0.9, "token", False),
                                                                     (0.8, 6, 0.9, "block", False),
                                                                     (0.8, 6, 0.9, "token", True)])
def test_joint_of_first_three_tokens_is_exact(tiny_pair, temperature, top_k, top_p, verifier, corpus):
    """5,000 generations of 3 tokens through batch_generate with a lookup draft of up to 3 tokens,
    token-wise and block verification, with and without a corpus: the joint of the three tokens
    (512 cells) is the target's."""
    target, _ = tiny_pair
    draft = PromptLookup(corpus=corpus_of([4, 1, 5, 2, 6, 5, 3, 5]) if corpus else None)
    seqs = batched_samples(target, draft, REPEATING, 3, 5000, temperature=temperature, top_k=top_k, top_p=top_p,
                           num_draft_tokens=3, verifier=verifier)
    stat, threshold, df = chi_square(sequence_counts(seqs, 8), exact_joint(target, REPEATING, 3, temperature, top_k, top_p))
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"


@pytest.mark.slow
def test_the_joint_test_fails_the_proposals_themselves(tiny_pair):
    """Negative control: taking the lookup's proposals without verification fails the same test."""
    target, _ = tiny_pair
    index = LookupIndex(1)
    index.append(0, REPEATING)
    index.commit()
    proposal = index.propose(3)[0][0].tolist()
    seqs = torch.tensor([proposal] * 500)
    stat, threshold, _ = chi_square(sequence_counts(seqs, 8), exact_joint(target, REPEATING, 3, 1.0, 0, 1.0))
    assert stat > threshold


def test_the_lookup_is_used_and_sometimes_rejected(tiny_pair):
    """The exactness test has power: proposals are made, accepted and rejected."""
    target, _ = tiny_pair
    out = batch_generate(target, PromptLookup(), input_ids=[REPEATING] * 64, max_new_tokens=3, seeds=list(range(64)),
                         temperature=1.0, num_draft_tokens=3, eos_token_id=NO_EOS, guard=False)  # every round drafts
    drafted = sum(o.stats.drafted for o in out.outputs)
    accepted = sum(o.stats.accepted for o in out.outputs)
    assert 0 < accepted < drafted


@pytest.mark.parametrize("lean", ["auto", "off", "q8"])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("prompt", [[5], [2, 7, 1, 0, 3, 2, 7, 1], list(range(12)) * 2])
def test_greedy_equals_target_greedy(k, prompt, lean):
    """One sequence and a batch whose rows look up different lengths (each row feeds its own
    drafts only; the rest of the round's width are holes), on the lean path (fp32 and 8-bit
    activations) and transformers'."""
    target = tiny_llama(10, vocab=16, context=128)
    expected = generate_autoregressive(target, prompt, max_new_tokens=40, temperature=0.0, eos_token_id=NO_EOS,
                                       lean=lean).tokens
    ours = fast_generate(target, PromptLookup(), prompt, max_new_tokens=40, temperature=0.0, num_draft_tokens=k,
                         eos_token_id=NO_EOS, lean=lean)
    assert ours.tokens == expected
    batch = batch_generate(target, PromptLookup(), input_ids=[prompt, [1, 2, 1, 2, 1], [9]], max_new_tokens=40,
                           temperature=0.0, num_draft_tokens=k, eos_token_id=NO_EOS, lean=lean)
    assert batch.outputs[0].tokens == expected
    assert batch.outputs[2].tokens == generate_autoregressive(target, [9], max_new_tokens=40, temperature=0.0,
                                                              eos_token_id=NO_EOS, lean=lean).tokens


def test_greedy_on_a_repeating_context_accepts_copies():
    """A target that continues a cycle: the lookup copies it and every proposal is accepted."""
    target = tiny_llama(10, vocab=16, context=128)
    cycle = generate_autoregressive(target, [1, 2, 3], max_new_tokens=60, temperature=0.0, eos_token_id=NO_EOS).tokens
    prompt = [1, 2, 3] + cycle[:40]
    out = fast_generate(target, PromptLookup(), prompt, max_new_tokens=20, temperature=0.0, num_draft_tokens=4,
                        eos_token_id=NO_EOS, guard=False)
    assert out.tokens == cycle[40:60]
    assert out.stats.rounds < 20 and out.stats.accepted > 0


def test_proposals_come_from_the_context():
    lm = LookupLM(PromptLookup(max_n=2, max_tokens=3), vocab_size=10)
    lm.extend(torch.tensor([[1, 2, 3, 4, 1]]), torch.ones(1, 5, dtype=torch.bool), 1)  # a prefill: no proposal
    lm.begin_round()
    logits = lm.extend(torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.bool), 1)[:, -1]  # "1 2" occurred: 3 4 1
    assert int(logits.argmax()) == 3 and torch.isinf(logits).sum() == 9 and lm.proposal_lengths.tolist() == [3]
    logits = lm.extend(torch.tensor([[3]]), torch.ones(1, 1, dtype=torch.bool), 1)[:, -1]
    assert int(logits.argmax()) == 4
    lm.keep(torch.tensor([6]))  # the drafted 3 rejected
    assert lm.lengths.tolist() == [6] and lm.proposal_lengths.tolist() == [0]


def test_errors():
    target = tiny_llama(10, vocab=16)
    with pytest.raises(ValueError, match="need a draft with a distribution"):
        fast_generate(target, PromptLookup(), [1, 2], max_new_tokens=4, num_alternatives=2)
    with pytest.raises(ValueError, match="1 <= min_n <= max_n <= 8"):
        PromptLookup(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        PromptLookup(max_tokens=0)


def test_the_corpus_proposes_where_the_context_has_no_longer_match():
    """A corpus match longer than the context's wins; a shorter one does not."""
    lm = LookupLM(PromptLookup(max_n=3, corpus=corpus_of([7, 8, 9, 1, 2, 3, 6, 6])), vocab_size=16)
    lm.begin_round()
    lm.extend(torch.tensor([[9, 1, 2, 0, 5, 8, 9, 1]]), torch.ones(1, 8, dtype=torch.bool), 1)
    assert lm.plan[0, : int(lm.proposal_lengths[0])].tolist() == [2, 3, 6, 6] and int(lm.matched[0]) == 3  # "8 9 1" vs "9 1"
    lm = LookupLM(PromptLookup(max_n=3, corpus=corpus_of([9, 1, 4, 4])), vocab_size=16)
    lm.begin_round()
    lm.extend(torch.tensor([[8, 9, 1, 2, 0, 8, 9, 1]]), torch.ones(1, 8, dtype=torch.bool), 1)
    assert lm.plan[0, : int(lm.proposal_lengths[0])].tolist() == [2, 0, 8, 9, 1] and int(lm.matched[0]) == 3


def test_a_learning_corpus_carries_text_across_requests():
    """With learn=True, each finished request joins the corpus: repeating a greedy request then
    copies its whole answer (fewer rounds than the first time), and the output stays the target's."""
    target = tiny_llama(10, vocab=16, context=256)
    prompt = [5, 9, 2]
    expected = generate_autoregressive(target, prompt, max_new_tokens=40, temperature=0.0, eos_token_id=NO_EOS).tokens
    corpus = LookupCorpus(max_n=3, capacity=1 << 10)
    draft = PromptLookup(max_tokens=8, corpus=corpus)
    first = fast_generate(target, draft, prompt, max_new_tokens=40, temperature=0.0, num_draft_tokens=8, eos_token_id=NO_EOS,
                          guard=False)  # the rounds the corpus makes, not whether they pay
    assert len(corpus) == len(prompt) + 40
    second = fast_generate(target, draft, prompt, max_new_tokens=40, temperature=0.0, num_draft_tokens=8, eos_token_id=NO_EOS,
                           guard=False)
    assert first.tokens == second.tokens == expected
    assert second.stats.rounds <= 40 / 8 + 1 < first.stats.rounds
    batch = batch_generate(target, draft, input_ids=[prompt, [3, 3]], max_new_tokens=40, temperature=0.0,
                           num_draft_tokens=8, eos_token_id=NO_EOS)
    assert batch.outputs[0].tokens == expected and len(corpus) == 2 * (len(prompt) + 40) + len(prompt) + 40 + 2 + 40


def test_the_corpus_is_bounded():
    corpus = LookupCorpus(capacity=1 << 4, max_tokens=10)
    corpus.add(list(range(8)))
    corpus.add(list(range(5)))  # past max_tokens: not added
    assert len(corpus) == 8 and corpus.full
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        LookupCorpus(max_tokens=0)
