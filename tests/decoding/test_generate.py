"""fast_generate end to end on tiny transformers models: exact distribution, greedy
equivalence, KV-cache rollback, reproducibility, the CachedLM protocol, bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from specdec_fast import HFCachedLM, SpeculativeDecoder, fast_generate, generate_autoregressive, warmup
from specdec_fast.models.lean import LeanLM

from helpers.distribution import chi_square, counts, sequence_counts
from helpers.markov import BigramLM, bigram_joint
from helpers.models import NO_EOS, PROMPT, LeanForward, batched_samples, exact_joint, tiny_llama


@pytest.mark.slow
@pytest.mark.parametrize(
    "temperature,top_k,top_p,k,runs,lean",
    [(1.0, 0, 1.0, 2, 6000, "auto"), (0.8, 6, 0.9, 3, 5000, "auto"), (0.8, 6, 0.9, 3, 5000, "off"),
     (0.8, 6, 0.9, 3, 5000, "q8")],
)
def test_joint_of_first_three_tokens_is_exact(tiny_pair, temperature, top_k, top_p, k, runs, lean):
    """The round's law: the first three tokens against the target's exact joint (512 cells), with the
    target on the lean path (the default), on transformers' (``lean="off"``) and with 8-bit
    activations (``lean="q8"``: the joint of that model, enumerated on the lean path; the others'
    with transformers' forward). The runs go through batch_generate, 64 requests at a
    time: fast_generate runs the same round as a batch of one and equals a batch row seed by seed
    (test_batch.py), so this is its law too."""
    target, draft = tiny_pair
    seqs = batched_samples(target, draft, PROMPT, 3, runs, temperature=temperature, top_k=top_k, top_p=top_p,
                           num_draft_tokens=k, lean=lean)
    law = LeanForward(target, lean) if lean == "q8" else target
    stat, threshold, df = chi_square(sequence_counts(seqs, target.config.vocab_size),
                                     exact_joint(law, PROMPT, 3, temperature, top_k, top_p))
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"


@pytest.mark.slow
def test_joint_test_detects_the_draft_distribution(tiny_pair):
    """Negative control: samples of the draft alone must fail the same joint test."""
    target, draft = tiny_pair
    vocab = target.config.vocab_size
    seqs = torch.tensor([generate_autoregressive(draft, PROMPT, max_new_tokens=3, temperature=1.0, seed=s, eos_token_id=NO_EOS).tokens for s in range(3000)])
    stat, threshold, _ = chi_square(sequence_counts(seqs, vocab), exact_joint(target, PROMPT, 3, 1.0, 0, 1.0))
    assert stat > threshold


@pytest.mark.parametrize("lean", ["auto", "off", "q8"])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("prompt", [[5], [2, 7, 1, 0, 3], [t % 13 for t in range(150)]])  # the last: a prefill_pass prompt
def test_greedy_equals_target_greedy(k, prompt, lean):
    """The target's own greedy tokens, and transformers' (except with 8-bit activations: another model)."""
    target, draft = tiny_llama(10, vocab=16, context=256), tiny_llama(11, vocab=16, layers=1, context=256)
    ours = fast_generate(target, draft, prompt, max_new_tokens=40, temperature=0.0, num_draft_tokens=k, eos_token_id=NO_EOS,
                         lean=lean)
    baseline = generate_autoregressive(target, prompt, max_new_tokens=40, temperature=0.0, eos_token_id=NO_EOS, lean=lean)
    assert ours.tokens == baseline.tokens
    if lean != "q8":
        ids = torch.tensor([prompt])
        hf = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False, pad_token_id=0)
        assert ours.tokens == hf[0, len(prompt):].tolist()
    # the draft may or may not agree with this target: whatever it does, the output is the target's


def test_greedy_with_target_as_its_own_draft_accepts_everything():
    target = tiny_llama(10, vocab=16)
    out = fast_generate(target, target, [1, 2], max_new_tokens=21, temperature=0.0, num_draft_tokens=4, eos_token_id=NO_EOS,
                        guard=False)  # the rounds themselves, not whether they pay (a draft as dear as the target does not)
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.rounds == 5  # 4 rounds of 5 tokens, then 1 token
    assert out.tokens == generate_autoregressive(target, [1, 2], max_new_tokens=21, temperature=0.0, eos_token_id=NO_EOS).tokens


@pytest.mark.parametrize("cache", [HFCachedLM, LeanLM])
@pytest.mark.parametrize("alternatives", [0, 2])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cache_after_rounds_equals_full_recompute(tiny_pair, temperature, alternatives, cache):
    """After accept/reject rounds (and rounds that kept a first-token alternative) both caches
    (transformers' or the lean path's) hold exactly the committed prefix: the next logits from the
    cache equal those of a full forward pass over the sequence."""
    target, draft = tiny_pair
    t, d = cache(target), cache(draft)
    out = fast_generate(t, d, PROMPT, max_new_tokens=30, temperature=temperature, num_draft_tokens=4,
                        num_alternatives=alternatives, seed=1, eos_token_id=NO_EOS, guard=False)  # every round drafts
    assert 0 < out.stats.accepted < out.stats.drafted  # both accepts and rejects happened
    assert out.stats.alternatives_accepted > 0 or not alternatives
    seq = torch.tensor(PROMPT + out.tokens)
    assert t.cache_length == len(seq) - 1 and d.cache_length <= len(seq)
    for lm, model in ((t, target), (d, draft)):
        cached = lm.extend(seq[lm.cache_length :], 1)[-1]
        with torch.no_grad():
            full = model(seq[None]).logits[0, -1]
        torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-5)


def test_same_seed_same_output(tiny_pair):
    target, draft = tiny_pair
    runs = [fast_generate(target, draft, PROMPT, max_new_tokens=25, temperature=1.0, seed=s, eos_token_id=NO_EOS).tokens
            for s in (4, 4, 5)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    ar = [generate_autoregressive(target, PROMPT, max_new_tokens=25, temperature=1.0, seed=s, eos_token_id=NO_EOS).tokens
          for s in (4, 4, 5)]
    assert ar[0] == ar[1] and ar[0] != ar[2]


def test_stats_are_consistent(tiny_pair):
    target, draft = tiny_pair
    s = fast_generate(target, draft, PROMPT, max_new_tokens=50, temperature=1.0, num_draft_tokens=3, seed=0,
                      eos_token_id=NO_EOS, guard=False).stats  # every round drafts
    assert s.new_tokens == 50 and s.drafted == sum(s.drafted_at) and s.accepted == sum(s.accepted_at)
    assert s.target_calls == s.rounds + 1  # prefill + one verification pass per round
    assert s.new_tokens == s.accepted + s.rounds  # each round: accepted drafts + one target token
    assert s.mean_accepted_length == pytest.approx(s.new_tokens / s.rounds)
    assert all(0 <= a <= 1 for a in s.per_position_acceptance) and len(s.drafted_at) == 3
    assert s.tokens_per_second > 0
    assert 0 < s.draft_s + s.target_s + s.verify_s <= s.wall_s and s.verify_s > 0


def test_stops_at_eos(tiny_pair):
    target, draft = tiny_pair
    free = fast_generate(target, draft, PROMPT, max_new_tokens=40, temperature=0.0, eos_token_id=NO_EOS).tokens
    eos = free[5]
    out = fast_generate(target, draft, PROMPT, max_new_tokens=40, temperature=0.0, eos_token_id=eos).tokens
    assert out == free[: free.index(eos) + 1]


@pytest.mark.slow
def test_cached_lm_protocol_exact_distribution():
    """A bigram target and draft: the second generated token's marginal is exact."""
    g = torch.Generator().manual_seed(0)
    tp, tq = 2 * torch.randn(6, 6, generator=g), 2 * torch.randn(6, 6, generator=g)
    target, draft = BigramLM(tp), BigramLM(tq)
    seqs = torch.tensor([fast_generate(target, draft, [0], max_new_tokens=2, temperature=1.0, num_draft_tokens=2, seed=s).tokens
                         for s in range(8000)])
    stat, threshold, _ = chi_square(counts(seqs[:, 1], 6), bigram_joint(target, 0, 2).reshape(6, 6).sum(0))
    assert stat < threshold


def test_speculative_decoder_accumulates_metrics(tiny_pair):
    target, draft = tiny_pair
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=3, temperature=0.0)
    for _ in range(2):
        out = decoder.generate(PROMPT, max_new_tokens=10, eos_token_id=NO_EOS)
    m = decoder.get_efficiency_metrics()
    assert m["new_tokens"] == 20 and m["drafted"] == 2 * out.stats.drafted
    assert m["acceptance_rate"] == out.stats.acceptance_rate
    assert m["alternatives"] == 0


def test_speculative_decoder_passes_alternatives_on(tiny_pair):
    target, draft = tiny_pair
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=2, temperature=0.0, num_alternatives=2,
                                 guard=False)
    out = decoder.generate(PROMPT, max_new_tokens=12, eos_token_id=NO_EOS)
    assert out.tokens == generate_autoregressive(target, PROMPT, max_new_tokens=12, temperature=0.0, eos_token_id=NO_EOS).tokens
    m = decoder.get_efficiency_metrics()
    assert m["alternatives"] == out.stats.alternatives == 2 * out.stats.drafted_at[0] > 0
    assert m["alternatives_accepted"] == out.stats.alternatives_accepted


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(input_ids=[]), "empty prompt"),
        (dict(input_ids=[[1, 2], [3, 4]]), r"input_ids must have shape \[S\] or \[1, S\]"),
        (dict(input_ids=[1, 99]), r"outside \[0, 8\)"),
        (dict(input_ids=list(range(8)) * 8), "exceeds the model's context of 64 tokens"),
        (dict(prompt="hi"), "pass exactly one of input_ids, prompt or messages"),
        (dict(input_ids=None, prompt="hi"), "a text prompt needs a tokenizer"),
        (dict(temperature=-0.5), "temperature"),
        (dict(num_draft_tokens=-1), "num_draft_tokens"),
        # What the verifier cannot honour, and transformers-shaped inputs it cannot take.
        (dict(repetition_penalty=1.2), "repetition_penalty=1.2 .passed. changes the target's distribution"),
        (dict(generation_config=GenerationConfig(num_beams=4)), "num_beams=4 .from the generation config."),
        (dict(stop_strings=["x"]), "stop_strings"),
        (dict(logits_processor=[]), "unsupported generation argument 'logits_processor'"),
        (dict(do_sample=True, temperature=0.0), "do_sample=True needs a temperature > 0"),
        (dict(max_new_tokens=None, max_length=len(PROMPT)), "max_length leaves no room"),
        (dict(input_ids=torch.tensor([[1.0, 2.0]])), "integer token ids"),
        (dict(input_ids=torch.tensor([[1, 2], [3, 4]])), "for several prompts use batch_generate"),
        (dict(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]])), "one sequence takes no padding"),
    ],
)
def test_bad_generation_arguments(tiny_pair, kwargs, message):
    target, draft = tiny_pair
    args = dict(input_ids=PROMPT, max_new_tokens=5) | kwargs
    with pytest.raises(ValueError, match=message):
        fast_generate(target, draft, **args)


def test_vocabulary_or_device_mismatch(tiny_pair):
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        fast_generate(tiny_pair[0], tiny_llama(2, vocab=9), PROMPT, max_new_tokens=5)
    with pytest.raises(ValueError, match="device mismatch: target is on cpu, draft on meta"):
        fast_generate(tiny_pair[0], tiny_llama(2, layers=1).to("meta"), PROMPT, max_new_tokens=5)


def test_not_a_model():
    with pytest.raises(TypeError, match="neither a transformers causal LM nor a CachedLM"):
        fast_generate(object(), object(), PROMPT)


def test_warmup_leaves_no_state():
    """After warmup() on the same cached models, a generation is what it would be without it."""
    target, draft = HFCachedLM(tiny_llama(10, vocab=16)), HFCachedLM(tiny_llama(11, vocab=16, layers=1))
    # without the guard, whose choices follow the clock: the same seed then draws the same tokens
    fresh = fast_generate(target, draft, [1, 2, 3], max_new_tokens=20, temperature=1.0, seed=5, eos_token_id=NO_EOS, guard=False)
    assert warmup(target, draft) > 0
    assert warmup(target) > 0
    again = fast_generate(target, draft, [1, 2, 3], max_new_tokens=20, temperature=1.0, seed=5, eos_token_id=NO_EOS, guard=False)
    assert again.tokens == fresh.tokens and again.stats.rounds == fresh.stats.rounds


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: fast_generate with the models and kernels on it")
def test_on_cuda_greedy_is_the_target_greedy_and_sampling_is_exact():
    """On a GPU, `auto` takes the CUDA kernels: greedy output equals the target's own (HF
    generate on the GPU) and the first two tokens' joint follows the target's exactly."""
    from specdec_fast.kernels.backends import resolve

    device = torch.device("cuda")
    assert resolve("auto", device) == "cuda", "the CUDA kernels did not build or load"
    target, draft = tiny_llama(0).to(device), tiny_llama(1, layers=1).to(device)
    ids = torch.tensor([PROMPT], device=device)
    hf = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, pad_token_id=0)
    greedy = fast_generate(target, draft, PROMPT, max_new_tokens=30, temperature=0.0, num_draft_tokens=3, eos_token_id=NO_EOS)
    assert greedy.tokens == hf[0, len(PROMPT):].tolist()

    vocab, runs = target.config.vocab_size, 2000
    seqs = torch.tensor([
        fast_generate(target, draft, PROMPT, max_new_tokens=2, temperature=1.0, num_draft_tokens=2, seed=seed,
                      eos_token_id=NO_EOS).tokens
        for seed in range(runs)
    ])
    stat, threshold, df = chi_square(sequence_counts(seqs, vocab),
                                     exact_joint(target.cpu(), PROMPT, 2, 1.0, 0, 1.0))
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"
