"""First-token alternatives (specdec_fast/alternatives.py): the sibling pass and its cache,
the recursive rejection rule's first token against the target exactly, the loop's joint
of three tokens, greedy equality, misuse (caches after rounds: test_generate.py)."""

from __future__ import annotations

import pytest
import torch

import specdec_fast.decoding.alternatives as alternatives_module
from specdec_fast import HFCachedLM, fast_generate, generate_autoregressive, use_packed_gqa, warp_logits
from specdec_fast.decoding.alternatives import draw_alternatives, verify_alternatives
from specdec_fast.kernels.sampling import sample_inverse_cdf

from helpers.distribution import chi_square, counts, sequence_counts
from helpers.markov import bigram_joint, bigram_pair
from helpers.models import NO_EOS, PROMPT, tiny_llama


@pytest.mark.parametrize("attention", ["sdpa", "eager", "packed-gqa"])
def test_sibling_pass_equals_separate_passes_and_keeps_the_chosen_sibling(attention):
    """Chain rows equal a plain pass, each sibling's row equals a pass over prefix + sibling,
    and after keep_sibling the cache is the cache of prefix + sibling computed from scratch."""
    model = tiny_llama(3, vocab=16)
    if attention == "packed-gqa":
        use_packed_gqa(model)
    elif attention == "eager":
        model.set_attn_implementation("eager")
    prefix, chain, siblings = torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10])
    lm = HFCachedLM(model)
    lm.extend(prefix, 1)
    out = lm.extend_siblings(chain, siblings, 1, 2)
    assert out.shape == (2 + 3, 16) and lm.cache_length == 4 + 3 + 3
    torch.testing.assert_close(out[:2], HFCachedLM(model).extend(torch.cat([prefix, chain]), 2), rtol=1e-4, atol=1e-5)
    for j in range(3):
        alone = HFCachedLM(model).extend(torch.cat([prefix, chain[:1], siblings[j : j + 1]]), 1)[0]
        torch.testing.assert_close(out[2 + j], alone, rtol=1e-4, atol=1e-5)
    lm.keep_sibling(6, 4 + 3 + 2)  # sibling 2 becomes the 6th cached token
    scratch = HFCachedLM(model)
    scratch.extend(torch.cat([prefix, chain[:1], siblings[2:]]), 1)
    assert lm.cache_length == 6
    torch.testing.assert_close(lm.extend(torch.tensor([11]), 1), scratch.extend(torch.tensor([11]), 1), rtol=1e-4, atol=1e-5)


def first_tokens(p_logits, q_logits, temperature, top_k, top_p, count, trials, seed) -> tuple[torch.Tensor, int]:
    """First emitted tokens of ``trials`` rounds: X_1 ~ q tested token-wise, then, on its
    rejection, ``count`` alternatives; returns (tokens [trials], rounds an alternative won)."""
    g = torch.Generator().manual_seed(seed)
    n = lambda v: torch.tensor([v])  # noqa: E731
    p = warp_logits(p_logits[None], n(temperature), n(top_k), n(top_p))[0]
    q = warp_logits(q_logits[None], n(temperature), n(top_k), n(top_p))[0]
    tokens, wins = [], 0
    for _ in range(trials):
        u = torch.rand(count + 3, generator=g).clamp_min(1e-12)
        x = int(sample_inverse_cdf(q[None], u[:1])[0])
        if u[1] * q[x] <= p[x]:
            tokens.append(x)
            continue
        alts = draw_alternatives(q_logits, q, x, count, temperature, g)
        j, y = verify_alternatives(p, q, x, alts, u[2 : 3 + len(alts)], greedy=temperature == 0)
        tokens.append(y)
        wins += j >= 0
    return torch.tensor(tokens), wins


def related_logits(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits over 8 tokens, the draft's a noisy copy of the target's."""
    g = torch.Generator().manual_seed(seed)
    p_logits = 1.5 * torch.randn(8, generator=g)
    return p_logits, p_logits + torch.randn(8, generator=g)


CASES = [(1.0, 0, 1.0, 1), (1.0, 0, 1.0, 3), (0.7, 4, 0.9, 2), (1.0, 3, 1.0, 5)]  # the last: more than q's support


@pytest.mark.parametrize("temperature,top_k,top_p,count", CASES)
def test_first_token_follows_the_target(temperature, top_k, top_p, count):
    p_logits, q_logits = related_logits(seed=0)
    tokens, wins = first_tokens(p_logits, q_logits, temperature, top_k, top_p, count, 20000, seed=1)
    p = warp_logits(p_logits[None], torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]))[0]
    stat, threshold, df = chi_square(counts(tokens, 8), p)
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"
    assert wins > 500  # the alternatives did the work, not only X_1 and the residual


def test_first_token_test_detects_a_missing_residual_update(monkeypatch):
    """Negative control: testing each alternative against p itself, not the residual left by
    the rejections before it, over-emits the tokens the draft favours; the test must fail."""
    monkeypatch.setattr(alternatives_module, "_residual", lambda p, q: p)
    p_logits, q_logits = related_logits(seed=0)
    tokens, _ = first_tokens(p_logits, q_logits, 1.0, 0, 1.0, 3, 20000, seed=1)
    p = torch.softmax(p_logits.double(), -1)
    stat, threshold, _ = chi_square(counts(tokens, 8), p)
    assert stat > threshold


def test_draws_are_distinct_and_follow_q():
    """At T > 0 the first alternative after X_1 = x follows q without x (renormalised); at
    T = 0 alternatives are the draft's next likeliest tokens; tokens with q = 0 are never drawn."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, generator=g)
    q = torch.softmax(logits, -1)
    draws = torch.stack([draw_alternatives(logits, q, 2, 3, 1.0, g) for _ in range(20000)])
    assert draws.shape == (20000, 3) and (draws != 2).all()
    assert all(len(set(row.tolist())) == 3 for row in draws[:500])
    without = q.clone()
    without[2] = 0
    stat, threshold, _ = chi_square(counts(draws[:, 0], 6), without / without.sum())
    assert stat < threshold
    assert draw_alternatives(logits, q, int(logits.argmax()), 2, 0.0, g).tolist() == logits.argsort(descending=True)[1:3].tolist()
    sparse = torch.tensor([0.5, 0.0, 0.5, 0.0])
    assert draw_alternatives(sparse.log(), sparse, 0, 3, 1.0, g).tolist() == [2]


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,k,count", [(1.0, 0, 1.0, 1, 3), (0.8, 6, 0.9, 2, 2)])
def test_joint_of_first_three_tokens_is_exact(temperature, top_k, top_p, k, count):
    """The loop with alternatives: rounds that emit an alternative and the target's token after
    it (from the sibling row and the moved cache entry) leave three tokens distributed exactly
    as the target's. 4,000 runs on a bigram pair (CachedLMs with sibling passes: the rule in the
    loop is the subject; transformers' sibling pass is tested against separate passes above, and
    with the feature draft in test_feature_draft.py)."""
    target, draft = bigram_pair(8, seed=2, siblings=True)  # a pair whose alternatives win in about half the runs, in both settings
    seqs, wins = [], 0
    for seed in range(4000):
        out = fast_generate(target, draft, PROMPT, max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p,
                            num_draft_tokens=k, num_alternatives=count, seed=seed, eos_token_id=NO_EOS, guard=False)
        seqs.append(out.tokens)
        wins += out.stats.alternatives_accepted
    stat, threshold, df = chi_square(sequence_counts(torch.tensor(seqs), 8),
                                     bigram_joint(target, PROMPT[-1], 3, temperature, top_k, top_p))
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"
    assert wins > 1000


@pytest.mark.parametrize("k,count", [(1, 1), (3, 3)])
def test_greedy_equals_target_greedy(k, count):
    target, draft = tiny_llama(10, vocab=16), tiny_llama(10, vocab=16, layers=1)  # same seed: close to the target
    out = fast_generate(target, draft, [5], max_new_tokens=40, temperature=0.0, num_draft_tokens=k,
                        num_alternatives=count, eos_token_id=NO_EOS, guard=False)  # every round drafts
    baseline = generate_autoregressive(target, [5], max_new_tokens=40, temperature=0.0, eos_token_id=NO_EOS)
    assert out.tokens == baseline.tokens
    assert out.stats.alternatives_accepted > 0 and out.stats.alternatives >= out.stats.rounds * count // 2


def test_misuse_is_a_clear_error(tiny_pair):
    target, draft = tiny_pair
    flex = tiny_llama(3)
    flex.config._attn_implementation = "flex_attention"  # the name is what extend_siblings checks
    with pytest.raises(ValueError, match="sibling passes need attention with a 4D mask .* uses 'flex_attention'"):
        HFCachedLM(flex).extend_siblings(torch.tensor([1, 2]), torch.tensor([3]), 1, 1)
    with pytest.raises(ValueError, match="num_alternatives must be a non-negative integer"):
        fast_generate(target, draft, PROMPT, max_new_tokens=4, num_alternatives=-1)
    with pytest.raises(ValueError, match="alternatives need verifier='token'"):
        fast_generate(target, draft, PROMPT, max_new_tokens=4, num_alternatives=2, verifier="block")
    with pytest.raises(ValueError, match="need a target with extend_siblings"):
        fast_generate(*bigram_pair(6, 0), [0], max_new_tokens=4, num_alternatives=2)
