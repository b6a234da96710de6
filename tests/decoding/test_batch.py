"""batch_generate on tiny transformers models and feature drafts: each request's output is what it
would be alone (fast_generate with its seed), greedy equals the target's greedy, the joint law of the first
tokens is exact per request setting, per-row rollback leaves exact caches, bad input errors."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import FixedDraftLength, ProductionSpeculativeDecoder, batch_generate, fast_generate, generate_autoregressive
from specdec_fast.models.batched_lm import BatchedLM, right_aligned
from specdec_fast.policies.costs import CostModel, geometric_acceptance
from specdec_fast.policies.learned import AcceptancePredictor, CostAwarePolicy
from specdec_fast.policies.monitoring import AdaptiveMonitoringSystem
from specdec_fast.policies.shipped import POLICY_FILES, default_policy

from helpers.distribution import chi_square, sequence_counts
from helpers.models import NO_EOS, PROMPT, exact_joint, feature_draft, tiny_llama

PROMPTS = [[3, 1, 4, 1, 5], [2], [7, 6, 5, 4, 3, 2, 1, 0, 1], [1, 2]]  # ragged, one single-token prompt
SEEDS = [10, 11, 12, 13]


def draft_for(target, kind: str):
    """A draft of ``kind`` for the 8-token ``target``: "model", a 1-layer transformers model;
    "feature", a feature draft restricted to 5 of the 8 tokens."""
    return tiny_llama(1, layers=1) if kind == "model" else feature_draft(target, torch.tensor([0, 1, 3, 4, 6]))


@pytest.mark.parametrize("kind", ["model", "feature"])
@pytest.mark.parametrize("eos", [NO_EOS, 5])
@pytest.mark.parametrize("k", [1, 3])
def test_each_request_gets_its_own_fast_generate_output(k, eos, kind):
    """Per-request settings and seeds; rows finish at different times (EOS, budget). A feature
    draft's rows draft from their own features and roll back by different amounts."""
    target = tiny_llama(0)
    draft = draft_for(target, kind)
    settings = dict(temperature=[1.0, 0.0, 0.8, 1.3], top_k=[0, 0, 5, 3], top_p=[1.0, 1.0, 0.9, 0.8])
    out = batch_generate(target, draft, input_ids=PROMPTS, max_new_tokens=15, seeds=SEEDS, num_draft_tokens=k,
                         eos_token_id=eos, **settings)
    for b, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS)):
        alone = fast_generate(target, draft, prompt, max_new_tokens=15, seed=seed, num_draft_tokens=k, eos_token_id=eos,
                              **{name: values[b] for name, values in settings.items()})
        got = out.outputs[b]
        assert got.tokens == alone.tokens
        assert (got.stats.rounds, got.stats.drafted, got.stats.accepted) == (alone.stats.rounds, alone.stats.drafted, alone.stats.accepted)
    assert out.new_tokens == sum(len(o.tokens) for o in out.outputs) and out.tokens_per_second > 0
    if eos != NO_EOS:
        assert any(o.tokens[-1] == eos and len(o.tokens) < 15 for o in out.outputs)


def test_output_does_not_depend_on_the_rest_of_the_batch(tiny_pair):
    target, draft = tiny_pair
    together = batch_generate(target, draft, input_ids=PROMPTS, max_new_tokens=12, temperature=1.0, seeds=SEEDS, eos_token_id=NO_EOS)
    alone = batch_generate(target, draft, input_ids=PROMPTS[2:3], max_new_tokens=12, temperature=1.0, seeds=SEEDS[2:3],
                           eos_token_id=NO_EOS)
    assert together.outputs[2].tokens == alone.outputs[0].tokens


@pytest.mark.parametrize("k, kind", [(0, None), (2, "model"), (5, "model"), (2, "feature"), (5, "feature")])
def test_greedy_equals_each_sequence_own_greedy(k, kind):
    target = tiny_llama(10, vocab=16)
    draft = {None: None, "model": tiny_llama(11, vocab=16, layers=1), "feature": feature_draft(target)}[kind]
    out = batch_generate(target, draft, input_ids=PROMPTS, max_new_tokens=30, temperature=0.0,
                         num_draft_tokens=k, eos_token_id=NO_EOS, guard=False)  # every round drafts k
    for prompt, got in zip(PROMPTS, out.outputs):
        assert got.tokens == generate_autoregressive(target, prompt, max_new_tokens=30, temperature=0.0, eos_token_id=NO_EOS).tokens
    assert out.draft_lengths[0] == k and max(out.draft_lengths) == k  # shorter only at the end of the budget


def test_joint_of_first_three_tokens_is_exact_per_request_setting(tiny_pair):
    """One batch of 64 copies of the prompt, half sampled at T=1, half at T=0.8 / top-k 6 / top-p 0.9."""
    target, draft = tiny_pair
    vocab, rows = target.config.vocab_size, 64
    settings = [(1.0, 0, 1.0), (0.8, 6, 0.9)]
    temperature, top_k, top_p = ([s[i] for s in settings for _ in range(rows // 2)] for i in range(3))
    samples: list[list[list[int]]] = [[], []]
    for batch in range(80):
        out = batch_generate(target, draft, input_ids=[PROMPT] * rows, max_new_tokens=3, num_draft_tokens=2,
                             temperature=temperature, top_k=top_k, top_p=top_p,
                             seeds=[batch * rows + i for i in range(rows)], eos_token_id=NO_EOS)
        for i, o in enumerate(out.outputs):
            samples[i // (rows // 2)].append(o.tokens)
    for setting, seqs in zip(settings, samples):
        seqs = torch.tensor(seqs)
        stat, threshold, df = chi_square(sequence_counts(seqs, vocab), exact_joint(target, PROMPT, 3, *setting))
        assert stat < threshold, f"{setting}: chi2 {stat:.1f} > {threshold:.1f} (df {df})"


def test_rollback_by_row_leaves_exact_caches(tiny_pair):
    """Ragged prefill, a pass with holes, a different rollback per row, one row leaving:
    the next logits of every row equal a full forward pass over its own sequence."""
    target, _ = tiny_pair
    lm = BatchedLM(target, 3)
    seqs = [[3, 1, 4], [2], [7, 6, 5, 4, 3]]
    lm.extend(*right_aligned(seqs), 1)
    extra = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 1]])
    lm.extend(extra, torch.tensor([[True, True, True], [False, True, True], [True, True, True]]), 3)
    keep = [4, 2, 6]  # row 0 keeps 1 of its 3 new tokens, row 1 one of 2, row 2 one of 3
    lm.keep(torch.tensor(keep))
    seqs = [seqs[0] + [1], seqs[1] + [5], seqs[2] + [7]]
    assert lm.lengths.tolist() == keep and lm.valid.shape[1] == 7  # the last slot, unused by all, is cropped
    lm.select(torch.tensor([0, 2]))
    seqs = [seqs[0], seqs[2]]
    nxt = torch.tensor([[6], [2]])
    logits = lm.extend(nxt, torch.ones(2, 1, dtype=torch.bool), 1)[:, -1]
    for row, seq in enumerate(seqs):
        with torch.no_grad():
            full = target(torch.tensor([seq + [int(nxt[row])]])).logits[0, -1]
        torch.testing.assert_close(logits[row], full, rtol=1e-4, atol=1e-5)


def test_cost_aware_policy_stops_drafting_when_the_batch_makes_passes_dear():
    """Costs in which a pass over 2 rows costs as much as over 1, but beyond 8 rows every row costs
    more: at 1 row drafting pays at acceptance 0.5, at 16 rows it does not (and a probe comes
    every probe_every rounds). The first round at a batch size drafts nothing: it measures T(rows)."""
    costs = CostModel({1: 0.001, 16: 0.01}, {1: 0.1, 2: 0.1, 4: 0.11, 8: 0.12, 16: 0.24, 32: 0.4})
    policy = CostAwarePolicy(AcceptancePredictor(), costs, probe_every=3)
    assert policy.begin_round(50, rows=16) == 0
    policy.observe(0, 0.0, 0.0, 0.24, rows=16)
    assert policy.begin_round(50, rows=16) == 1  # the first round that may draft measures alpha
    policy.observe(1, 0.5, 0.01, 0.4, rows=16)
    assert policy.token_acceptance == pytest.approx(0.5)
    assert policy.begin_round(50, rows=1) == 0
    policy.observe(0, 0.0, 0.0, 0.1, rows=1)
    assert policy.begin_round(50, rows=1) >= 2
    # every 4th round probes; a probe that does not bring drafting back doubles the gap
    assert [policy.begin_round(50, rows=16) for _ in range(12)] == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0]
    policy.observe(1, 1.0, 0.01, 0.4, rows=16)  # a probe where every row accepted its token
    assert policy.token_acceptance > 0.5


def test_cost_aware_policy_times_the_plain_pass_again_while_drafting_pays():
    """Where drafting pays round after round, every (probe_every + 1)-th round drafts nothing, so
    the plain pass is timed right after a drafting one and the cost model sees their ratio move."""
    costs = CostModel({1: 0.001}, {1: 0.1, 2: 0.1, 4: 0.1, 8: 0.1, 16: 0.1, 32: 0.1})
    policy = CostAwarePolicy(AcceptancePredictor(), costs, probe_every=3)
    assert policy.begin_round(50, rows=2) == 0
    policy.observe(0, 0.0, 0.0, 0.1, rows=2)
    assert policy.begin_round(50, rows=2) == 1
    policy.observe(1, 1.0, 0.002, 0.1, rows=2)
    assert [policy.begin_round(50, rows=2) > 0 for _ in range(8)] == [True, True, True, False] * 2


def test_cost_aware_policy_never_probes_where_drafting_cannot_pay():
    """The priors (one sequence, up to 10 tokens) say a pass costs the same at any size; the first
    round at 16 rows measures a 1-token pass at 0.12 s, so the priors scaled to it say a 2-token
    pass costs 0.12 s too and drafting would pay; the probe measures it at 0.5 s: from then on no
    round drafts there."""
    costs = CostModel({1: 0.001}, {1: 0.1, 2: 0.1, 10: 0.1})
    policy = CostAwarePolicy(AcceptancePredictor(), costs, probe_every=3)
    assert policy.begin_round(50, rows=16) == 0
    policy.observe(0, 0.0, 0.0, 0.12, rows=16)
    assert costs.target(32) == pytest.approx(0.12) and policy.begin_round(50, rows=16) == 1
    policy.observe(1, 1.0, 0.016, 0.5, rows=16)
    assert [policy.begin_round(50, rows=16) for _ in range(40)] == [0] * 40
    policy.observe(0, 0.0, 0.0, 0.1, rows=1)
    assert policy.begin_round(50, rows=1) >= 1  # one row: a 2-token pass costs what a 1-token pass does


def test_one_lucky_probe_does_not_make_alpha_one():
    policy = CostAwarePolicy(AcceptancePredictor(), CostModel(0.001, {1: 0.1, 2: 0.1, 9: 0.2}))
    policy.observe(0, 0.0, 0.0, 0.1, rows=1)  # T(1) measured
    assert policy.token_acceptance == 0.5 and policy.begin_round(50, rows=1) == 1  # the prior; a probe
    policy.observe(1, 1.0, 0.001, 0.1, rows=1)  # its one token accepted
    assert 0.5 < policy.token_acceptance < 0.7
    for _ in range(30):  # then rounds of 4 drafts where nothing is accepted
        policy.observe(4, 0.0, 0.004, 0.1, rows=1)
    assert policy.token_acceptance < 0.05 and policy.begin_round(50, rows=1) == 0


def test_geometric_acceptance_inverts_the_expected_accepted_length():
    for alpha in (0.1, 0.5, 0.9):
        for k in (1, 3, 6):
            assert geometric_acceptance(sum(alpha**i for i in range(1, k + 1)), k) == pytest.approx(alpha, abs=1e-6)
    assert geometric_acceptance(4.0, 4) == 1.0 and geometric_acceptance(0.0, 4) == pytest.approx(0.0, abs=1e-6)


def test_monitor_counts_every_row(tiny_pair):
    target, draft = tiny_pair
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=2, adapt=False)
    out = batch_generate(target, draft, input_ids=PROMPTS, max_new_tokens=10, seeds=SEEDS, policy=monitor, eos_token_id=NO_EOS)
    rounds = list(monitor.rounds)
    assert len(rounds) == len(out.draft_lengths) and rounds[0].rows == len(PROMPTS)
    assert sum(r.rows * (r.accepted + 1) for r in rounds) == pytest.approx(out.new_tokens)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(input_ids=[]), "empty batch"),
        (dict(input_ids=None), "pass exactly one of input_ids, prompts or messages"),
        (dict(input_ids=None, prompts="one string"), "a list of strings"),
        (dict(input_ids=[[1, 2], []]), "empty prompt"),
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(input_ids=[[1, 2], list(range(8)) * 8]), "exceeds the model's context of 64 tokens"),
        (dict(seeds=[1, 2, 3]), r"one entry per request \(2\)"),
        (dict(temperature=[1.0, 1.0, 1.0]), r"temperature must be one value or one per request \(2\)"),
        (dict(top_p=0.0), "top_p"),
    ],
)
def test_bad_batch_arguments(tiny_pair, kwargs, message):
    target, draft = tiny_pair
    args = dict(input_ids=[[1, 2], [3]], max_new_tokens=5) | kwargs
    with pytest.raises(ValueError, match=message):
        batch_generate(target, draft, **args)


def test_batch_vocabulary_or_device_mismatch_and_not_a_model(tiny_pair):
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        batch_generate(tiny_pair[0], tiny_llama(2, vocab=9), input_ids=[PROMPT])
    with pytest.raises(ValueError, match="device mismatch: target is on cpu, draft on meta"):
        batch_generate(tiny_pair[0], tiny_llama(2, layers=1).to("meta"), input_ids=[PROMPT])
    with pytest.raises(TypeError, match="not a transformers causal LM"):
        batch_generate(object(), None, input_ids=[PROMPT])


@pytest.mark.parametrize("kind", ["model", "feature"])
def test_production_decoder_batches_requests_and_keeps_totals(kind):
    target = tiny_llama(0)
    draft = draft_for(target, kind)
    decoder = ProductionSpeculativeDecoder(target, draft, policy=FixedDraftLength(2), batch_size=3, temperature=1.0)
    assert decoder.warmup() > 0
    outs = decoder.batch_generate(input_ids=PROMPTS, max_new_tokens=8, seeds=SEEDS, eos_token_id=NO_EOS)
    for prompt, seed, got in zip(PROMPTS, SEEDS, outs.outputs):  # batches of 3 and 1: each request as if alone
        assert got.tokens == fast_generate(target, draft, prompt, max_new_tokens=8, seed=seed, num_draft_tokens=2,
                                           temperature=1.0, eos_token_id=NO_EOS).tokens
    metrics = decoder.get_efficiency_metrics()
    assert metrics["new_tokens"] == 8 * len(PROMPTS) and metrics["tokens_per_second"] > 0
    with pytest.raises(ValueError, match="batch_size"):
        ProductionSpeculativeDecoder(target, draft, batch_size=0)
    shipped = default_policy(path=POLICY_FILES["feature" if kind == "feature" else "token"])
    assert ProductionSpeculativeDecoder(target, draft).settings["policy"].costs.draft(1) == shipped.costs.draft(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: batch_generate with the models and kernels on it")
@pytest.mark.parametrize("kind", ["model", "feature"])
def test_on_cuda_batch_is_each_request_alone(kind):
    """On a GPU: greedy batched output equals each sequence's own greedy decoding, and each
    sampled request equals fast_generate with its seed (the per-request counters)."""
    target = tiny_llama(10, vocab=16)
    draft = tiny_llama(11, vocab=16, layers=1) if kind == "model" else feature_draft(target)
    target, draft = target.cuda(), draft.cuda()
    greedy = batch_generate(target, draft, input_ids=PROMPTS, max_new_tokens=30, temperature=0.0, num_draft_tokens=3,
                            eos_token_id=NO_EOS)
    for prompt, got in zip(PROMPTS, greedy.outputs):
        assert got.tokens == generate_autoregressive(target, prompt, max_new_tokens=30, temperature=0.0,
                                                     eos_token_id=NO_EOS).tokens
    sampled = batch_generate(target, draft, input_ids=PROMPTS, max_new_tokens=20, temperature=1.0, num_draft_tokens=3,
                             seeds=SEEDS, eos_token_id=NO_EOS)
    for prompt, seed, got in zip(PROMPTS, SEEDS, sampled.outputs):
        assert got.tokens == fast_generate(target, draft, prompt, max_new_tokens=20, temperature=1.0, num_draft_tokens=3,
                                           seed=seed, eos_token_id=NO_EOS).tokens
