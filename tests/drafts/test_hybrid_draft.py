"""The hybrid draft (specdec_fast/drafts/hybrid.py): lossless with both sources in play (the exact
joint of the first tokens), greedy equal to the target's greedy decoding with a token or feature
model inside, and the per-row choice of source."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import batch_generate, fast_generate, generate_autoregressive
from specdec_fast.drafts.binding import batched_pair, cached_pair, draft_kind
from specdec_fast.drafts.hybrid import Hybrid
from specdec_fast.drafts.lookup import PromptLookup
from specdec_fast.models.batched_lm import right_aligned
from specdec_fast.policies.baselines import FixedDraftLength
from specdec_fast.policies.costs import CostModel
from specdec_fast.policies.sources import CostAwareSources, LookupAcceptance

from helpers.distribution import chi_square, sequence_counts
from helpers.models import NO_EOS, batched_samples, exact_joint, feature_draft, tiny_llama

REPEATING = [3, 1, 4, 1, 5, 1, 4]


def learned_chooser() -> CostAwareSources:
    """A chooser whose decisions move with the rounds it sees (random network, made-up costs)."""
    torch.manual_seed(3)
    return CostAwareSources(LookupAcceptance(), CostModel(1e-5, {n: 0.001 * (9 + n) for n in range(1, 6)}))


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,chooser", [(1.0, 0, 1.0, "rule"), (0.8, 6, 0.9, "default"),
                                                             (0.8, 6, 0.9, "learned")])
def test_joint_of_first_three_tokens_is_exact(tiny_pair, temperature, top_k, top_p, chooser):
    """5,000 generations of 3 tokens through batch_generate, looking up where the context offers a
    2-token match (the rule), where the default chooser finds it pays by the measured costs, or
    where a learned chooser says so, and drafting with the model elsewhere: the joint is the target's."""
    target, draft = tiny_pair
    hybrid = Hybrid(draft, PromptLookup(max_tokens=3), min_match=2, chooser=learned_chooser() if chooser == "learned" else None,
                    rule=chooser == "rule")
    seqs = batched_samples(target, hybrid, REPEATING, 3, 5000, temperature=temperature, top_k=top_k, top_p=top_p,
                           num_draft_tokens=2)
    stat, threshold, df = chi_square(sequence_counts(seqs, 8), exact_joint(target, REPEATING, 3, temperature, top_k, top_p))
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"


def test_each_row_chooses_its_source(tiny_pair):
    """A row whose context repeats a 2-token suffix looks up; a row without one drafts with the model
    (whose cache then catches up on the whole sequence)."""
    target, draft = tiny_pair
    _, lm = batched_pair(target, Hybrid(draft, min_match=2), 2)
    rows = [REPEATING + [1], [5, 6, 7]]
    lm.extend(*right_aligned([r[:-1] for r in rows]), 1)  # the prefill
    lm.begin_round()
    lm.extend(*right_aligned([r[-1:] for r in rows]), 1)
    assert lm.looked_up.tolist() == [True, False]
    assert lm.model.lengths.tolist() == [len(rows[0]) - 1, len(rows[1])]  # the looked-up row's model cache lags
    assert lm.plan_lengths([1, 1], [3, 3]) == [min(3, int(lm.lookup.proposal_lengths[0])), 1]


@pytest.mark.parametrize("kind", ["token", "feature"])
@pytest.mark.parametrize("min_match", [1, 3])
def test_greedy_equals_target_greedy(kind, min_match):
    target = tiny_llama(10, vocab=16, context=128)
    model = tiny_llama(11, vocab=16, layers=1, context=128) if kind == "token" else feature_draft(target)
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2], [5], [2, 7, 1, 0, 3, 2, 7, 1]]
    expected = [generate_autoregressive(target, p, max_new_tokens=30, temperature=0.0, eos_token_id=NO_EOS).tokens
                for p in prompts]
    for prompt, tokens in zip(prompts, expected):
        for hybrid in (Hybrid(model, min_match=min_match, rule=True), Hybrid(model), Hybrid(model, chooser=learned_chooser())):
            out = fast_generate(target, hybrid, prompt, max_new_tokens=30, temperature=0.0, num_draft_tokens=3, eos_token_id=NO_EOS)
            assert out.tokens == tokens
    for hybrid in (Hybrid(model, min_match=min_match, rule=True), Hybrid(model)):
        batch = batch_generate(target, hybrid, input_ids=prompts, max_new_tokens=30, temperature=0.0, num_draft_tokens=3,
                               eos_token_id=NO_EOS)
        assert [o.tokens for o in batch.outputs] == expected


def test_bad_min_match_or_a_rule_beside_a_chooser():
    with pytest.raises(ValueError, match="min_match must be positive"):
        Hybrid(torch.nn.Identity(), min_match=0)
    with pytest.raises(ValueError, match="rule=True or a chooser, not both"):
        Hybrid(torch.nn.Identity(), chooser=learned_chooser(), rule=True)


def test_the_chooser_decides_per_row_and_sees_each_round():
    """With a chooser, the first round of each row drafts with the model; once a row's model rounds
    are timed, a lookup it predicts to be faster is taken, with the chooser's length; the chooser
    is told each round's accepted count."""
    target, draft = tiny_pair_models()
    sources = learned_chooser()
    _, lm = batched_pair(target, Hybrid(draft, min_match=1, chooser=sources), 2)
    rows = [REPEATING + [1], [5, 6, 7]]
    lm.extend(*right_aligned([r[:-1] for r in rows]), 1)
    lm.begin_round()
    lm.extend(*right_aligned([r[-1:] for r in rows]), 1)
    assert lm.looked_up.tolist() == [False, False] and sources.pending is not None
    lm.keep(torch.tensor([len(rows[0]), len(rows[1])]))
    assert sources.pending is None and all(rate is not None for rate in sources.model_rate)
    sources.model_rate = [0.0, 0.0]  # any lookup beats a model that emits nothing
    lm.begin_round()
    lm.extend(*right_aligned([[4], [8]]), 1)  # the tokens the first round committed
    assert lm.looked_up.tolist() == [True, False]  # "... 1 4" recurs in the first row; [5, 6, 7, 8] has no match
    assert lm.plan_lengths([1, 1], [3, 3])[0] == min(3, int(lm.lookup_lengths[0]))


def tiny_pair_models():
    return tiny_llama(10, vocab=16, context=128), tiny_llama(11, vocab=16, layers=1, context=128)


def test_a_hybrid_is_the_kind_of_its_model():
    """The policy a hybrid gets is its model's (a feature draft's `lm` is its target, not a wrapper)."""
    target = tiny_llama(10, vocab=16, context=128)
    assert draft_kind(Hybrid(feature_draft(target))) == "feature"
    assert draft_kind(Hybrid(tiny_llama(11, vocab=16, layers=1))) == "token"
    _, one = cached_pair(target, Hybrid(feature_draft(target)))
    assert draft_kind(one) == "feature"


def test_a_hybrid_looks_up_where_the_models_policy_declines_and_leaves_the_model_idle():
    """The model's policy drafts nothing (k = 0): the hybrid still copies what the context repeats
    (greedy output unchanged), and its model runs for the prompt only."""
    target = tiny_llama(10, vocab=16, context=128)
    model = tiny_llama(11, vocab=16, layers=1, context=128)
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    cycle = generate_autoregressive(target, [1, 2, 3], max_new_tokens=60, temperature=0.0, eos_token_id=NO_EOS).tokens
    prompt = [1, 2, 3] + cycle[:40]
    for run in range(2):  # (the first also calibrates the pair, running the model)
        calls.clear()
        out = fast_generate(target, Hybrid(model, PromptLookup(max_tokens=4), rule=True), prompt, max_new_tokens=20,
                            temperature=0.0, policy=FixedDraftLength(0), eos_token_id=NO_EOS, guard=False)
    assert out.tokens == cycle[40:60] and out.stats.accepted > 0 and out.stats.rounds < 20
    assert len(calls) == 1  # the prompt's pass
