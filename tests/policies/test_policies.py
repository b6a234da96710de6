"""Draft-length policies: none may bias the output (exact joint, chi-square), and each does
what it says; the shipped learned policy loads."""

from __future__ import annotations

import pytest
import torch

import specdec_fast
from specdec_fast import fast_generate, generate_autoregressive
from specdec_fast.bench.policies import CurrentTokenAsNext, VerifyEveryFirstDraft
from specdec_fast.kernels import draft_step
from specdec_fast.policies.baselines import ConfidenceThreshold, EntropyStop, FixedDraftLength, HeuristicSchedule
from specdec_fast.policies.costs import CostModel
from specdec_fast.policies.learned import PREDICTOR_OUTPUTS, AcceptancePredictor, CostAwarePolicy, NetworkPolicy, ValueNetwork
from specdec_fast.policies.mdp import FEATURES, MDPState, SpeculativePolicy
from specdec_fast.policies.monitoring import AdaptiveMonitoringSystem
from specdec_fast.policies.shipped import POLICY_FILES, default_policy, load_policy, save_policy

from helpers.distribution import chi_square, sequence_counts
from helpers.markov import bigram_joint, bigram_pair
from helpers.models import NO_EOS, PROMPT, tiny_llama

RUNS = 6000


class StopOnEvenToken(SpeculativePolicy):
    """Adversarial but legal: stops after drafting an even token (a decision on the drafted token's value)."""

    def continue_drafting(self, position, step, temperature):
        return int(step.tokens[0]) % 2 == 1


class WithholdUnsure(FixedDraftLength):
    """Verifies no draft in rounds whose first draft distribution has top-1 probability below ``threshold``
    (a choice on the prefix: legal)."""

    def __init__(self, k: int, threshold: float):
        super().__init__(k)
        self.threshold = threshold

    def propose_first(self, step, temperature):
        return float(step.top1_prob[0]) >= self.threshold


class WithholdEvenToken(FixedDraftLength):
    """Illegal: withholds the first draft when the token drawn is even (a choice on the token's value)."""

    def propose_first(self, step, temperature):
        return int(step.tokens[0]) % 2 == 1


def cheap_cost_aware(verifier: str) -> CostAwarePolicy:
    torch.manual_seed(0)
    return CostAwarePolicy(AcceptancePredictor(), CostModel(1e-4, {1: 1e-3, 2: 1.1e-3, 6: 1.5e-3}), verifier=verifier,
                           max_draft_tokens=4, calibrate=False)


def value_policy(verifier: str) -> NetworkPolicy:
    torch.manual_seed(1)
    return NetworkPolicy(ValueNetwork(), max_draft_tokens=4)


POLICIES = {
    "heuristic": lambda v: HeuristicSchedule(start=1, max_draft_tokens=5),
    "confidence": lambda v: ConfidenceThreshold(0.5, max_draft_tokens=4),
    "entropy": lambda v: EntropyStop(0.5, max_draft_tokens=4),
    "cost-aware": cheap_cost_aware,
    "value network": value_policy,
    "stop on even token": lambda v: StopOnEvenToken(4),
    "withhold unsure first drafts": lambda v: WithholdUnsure(2, 0.6),
    "monitor (cap moves every round)": lambda v: AdaptiveMonitoringSystem(ConfidenceThreshold(0.5, 4), 4, window=2,
                                                                          period=1),
}
CASES = [(name, "token") for name in POLICIES] + [("cost-aware", "block"), ("stop on even token", "block"),
                                                  ("withhold unsure first drafts", "block")]


def joint_chi_square(policy, verifier: str) -> tuple[float, float, int, list]:
    """chi-square of the first 3 tokens' joint over RUNS seeds of a bigram pair (vocab 8, 512 cells)
    against the target's exact joint; also each run's stats. Without the guard: the policy alone
    decides every round (the guard's own chi-square is in test_guard.py)."""
    target, draft = bigram_pair(8, seed=0)
    runs, seqs = [], []
    for seed in range(RUNS):
        out = fast_generate(target, draft, PROMPT, max_new_tokens=3, temperature=1.0, policy=policy(verifier),
                            verifier=verifier, seed=seed, eos_token_id=NO_EOS, guard=False)
        seqs.append(out.tokens)
        runs.append(out.stats)
    seqs = torch.tensor(seqs)
    return (*chi_square(sequence_counts(seqs, 8), bigram_joint(target, PROMPT[-1], 3)), runs)


@pytest.mark.slow
@pytest.mark.parametrize("name,verifier", CASES)
def test_policy_keeps_the_exact_joint(name, verifier):
    """The joint of the first 3 tokens over RUNS seeds equals the target's exact joint."""
    stat, threshold, df, runs = joint_chi_square(POLICIES[name], verifier)
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"
    assert len({s.drafted / s.rounds for s in runs}) > 1, "the policy never varied the draft length: the test would not exercise it"
    if name.startswith("withhold"):
        withheld = sum(s.withheld for s in runs) / sum(s.rounds for s in runs)
        assert 0.1 < withheld < 0.9, f"{withheld:.2f} of rounds withheld: the test would not exercise withholding"


@pytest.mark.slow
def test_withholding_the_first_draft_by_its_value_is_caught():
    """The negative control of the rule in policy.py: withholding the first draft because of the token
    drawn verifies a distribution other than q, and the same test rejects it."""
    stat, threshold, df, _ = joint_chi_square(lambda v: WithholdEvenToken(2), "token")
    assert stat > threshold, f"chi2 {stat:.1f} <= {threshold:.1f} (df {df}): the bias went unseen"


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_greedy_with_a_policy_equals_target_greedy(verifier):
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    baseline = generate_autoregressive(target, [1, 2, 3], max_new_tokens=30, temperature=0.0, eos_token_id=NO_EOS)
    for policy in (EntropyStop(0.5), HeuristicSchedule(start=2), cheap_cost_aware(verifier), WithholdUnsure(3, 0.3)):
        out = fast_generate(target, draft, [1, 2, 3], max_new_tokens=30, temperature=0.0, policy=policy,
                            verifier=verifier, eos_token_id=NO_EOS)
        assert out.tokens == baseline.tokens


def state(**changes) -> MDPState:
    values = dict(position=1, entropy=1.0, top1=0.5, token_prob=0.5, survival=1.0, recent_acceptance=0.5, remaining=10,
                  temperature=1.0)
    return MDPState(**(values | changes))


def test_mdp_state_features_follow_the_feature_names():
    s = state(position=3, entropy=0.25, top1=0.9, token_prob=0.8, survival=0.7, recent_acceptance=0.6, remaining=0,
              temperature=0.7)
    assert len(FEATURES) == 8
    assert s.features().tolist() == pytest.approx([3, 0.25, 0.9, 0.8, 0.7, 0.6, 0.0, 0.7])


def test_heuristic_schedule_grows_after_full_acceptance_and_shrinks_otherwise():
    p = HeuristicSchedule(start=5, max_draft_tokens=8)
    assert p.begin_round(100) == 5
    p.observe(5, 5, 0.0, 0.0)
    assert p.begin_round(100) == 7
    p.observe(7, 2, 0.0, 0.0)
    assert p.begin_round(100) == 6
    p.observe(6, 6, 0.0, 0.0)
    assert p.begin_round(100) == 8  # capped
    assert p.begin_round(3) == 3  # the budget
    for _ in range(20):
        p.observe(3, 0, 0.0, 0.0)
    assert p.begin_round(100) == 1


def test_recent_acceptance_is_the_rate_of_accepted_first_tokens():
    """Independent of how many tokens the rounds drafted (the traces draft 8, the policies fewer)."""
    p = FixedDraftLength(4)
    p.smoothing = 0.5
    p.observe(4, 1, 0.0, 0.0)  # first token accepted: 1 of 4 drafts
    assert p.recent_acceptance == pytest.approx(0.75)
    p.observe(4, 0, 0.0, 0.0)
    assert p.recent_acceptance == pytest.approx(0.375)
    p.observe(0, 0, 0.0, 0.0)  # nothing drafted
    p.observe(4, 0.5, 0.0, 0.0, rows=2)  # a batch round: no MDPState is built from it
    assert p.recent_acceptance == pytest.approx(0.375)


def test_threshold_rules():
    assert ConfidenceThreshold(0.4).decide(state(token_prob=0.5)) and not ConfidenceThreshold(0.4).decide(state(token_prob=0.3))
    assert EntropyStop(0.4, gamma=0.6).decide(state(entropy=0.1))  # 1 - sqrt(0.06) = 0.76
    assert not EntropyStop(0.4, gamma=0.6).decide(state(entropy=2.0))  # 1 - sqrt(1.2) < 0


def test_fixed_length_validates():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        FixedDraftLength(-1)
    assert FixedDraftLength(3).begin_round(2) == 2


def test_cost_model_interpolates_and_learns():
    costs = CostModel(0.01, {1: 0.10, 3: 0.14})
    assert costs.target(2) == pytest.approx(0.12) and costs.target(5) == pytest.approx(0.18)  # extrapolated
    costs.update(drafted=2, draft_s=0.04, target_s=0.21)  # the first measurement: T(1) is its prior scaled as T(3)
    assert costs.draft() == pytest.approx(0.02) and costs.target(3) == pytest.approx(0.21) and costs.target(1) == pytest.approx(0.15)
    costs.update(drafted=0, draft_s=0.0, target_s=0.12)  # T(1) measured: T(2) lies between the two measured
    assert costs.target(1) == pytest.approx(0.12) and costs.target(3) == pytest.approx(0.21) and costs.target(2) == pytest.approx(0.165)
    costs.update(drafted=0, draft_s=0.0, target_s=0.18)  # T(1) again, 1.5x: the speed moves by half of it, T(3) too
    assert costs.target(1) == pytest.approx(0.12 * 1.5**0.5) and costs.target(3) == pytest.approx(0.21 * 1.5**0.5)
    costs.update(drafted=2, draft_s=0.04, target_s=0.3)  # T(3) right after T(1): T(3) / T(1) is the mean of the two pairs'
    assert costs.target(3) / costs.target(1) == pytest.approx((0.21 / 0.12 * 0.3 / (0.12 * 1.5**0.5)) ** 0.5)


def test_cost_model_follows_the_machine_not_the_last_size_measured():
    """A batch of 16 measures its 1-token pass (70 ms) and a 2-token probe (87 ms), then only 1-token
    passes while the machine slows to 1.5x: the 2-token pass is taken to cost 1.5x more too (the
    ratio of the two stays the measured one, where a 2-token pass left at 87 ms would look cheaper
    than a 1-token one); a later probe's ratio is averaged in."""
    costs = CostModel(0.001, {1: 0.1})
    costs.update(0, 0.0, 0.070, rows=16)
    costs.update(1, 0.005, 0.087, rows=16)
    for seconds in [0.070] * 3 + [0.105] * 20:
        costs.update(0, 0.0, seconds, rows=16)
    assert costs.target(16) == pytest.approx(0.105, rel=1e-4)
    assert costs.target(32) / costs.target(16) == pytest.approx(0.087 / 0.070, rel=1e-4)
    costs.update(1, 0.005, 0.105 * 1.3, rows=16)
    assert costs.target(32) / costs.target(16) == pytest.approx((1.3 * 0.087 / 0.070) ** 0.5, rel=1e-3)


def predicting(*outputs: float) -> AcceptancePredictor:
    """A predictor whose outputs (PREDICTOR_OUTPUTS order) are these constants for every state."""
    predictor = AcceptancePredictor()
    with torch.no_grad():
        predictor.net[-1].weight.zero_()
        predictor.net[-1].bias.copy_(torch.logit(torch.tensor(outputs)))
    return predictor


def first_steps() -> list:
    """Draft steps of one distribution (top-1 0.7) that drew different tokens."""
    logits = torch.tensor([[0.7, 0.2, 0.1]]).log()
    steps = [draft_step(logits, uniforms=torch.tensor([u])) for u in (0.1, 0.95)]
    assert steps[0].tokens != steps[1].tokens and steps[0].token_prob != steps[1].token_prob
    return steps


def gate_costs() -> CostModel:
    """Throughput 10 tok/s (a round of 1 token in 0.1 s): a first draft pays at acceptance > 0.6
    (T(2) - T(1) = 0.06 s), a second at survival x next acceptance > 0.8 (0.02 s more for the step)."""
    return CostModel(0.02, {1: 0.1, 2: 0.16, 3: 0.22})


def test_cost_aware_policy_drafts_only_when_it_pays():
    """Per round: draft at all only if a sure acceptance would pay for a draft step and the larger
    target pass; verify the first draft only if its predicted acceptance pays for the larger pass;
    continue only if the next token's predicted survival pays for a step and the larger pass."""
    cheap = CostAwarePolicy(predicting(0.99, 0.25, 0.99, 0.25), CostModel(0.001, {1: 0.1, 2: 0.101, 9: 0.108}))
    assert cheap.begin_round(50) == 8 and all(cheap.propose_first(s, 1.0) for s in first_steps()) and cheap.decide(state())
    for accept, verified in ((0.5, False), (0.65, True)):
        policy = CostAwarePolicy(predicting(accept, 0.25, 0.99, 0.25), gate_costs())
        assert policy.begin_round(50) == 8
        assert [policy.propose_first(s, 1.0) for s in first_steps()] == [verified] * 2  # the token drawn is not read
    sure_now = CostAwarePolicy(predicting(0.99, 0.25, 0.7, 0.25), gate_costs())
    sure_now.begin_round(50)
    assert not sure_now.decide(state())  # survival 0.99, next acceptance 0.7: 0.69 < 0.8
    sure_next = CostAwarePolicy(predicting(0.99, 0.25, 0.9, 0.25), gate_costs())
    sure_next.begin_round(50)
    assert sure_next.decide(state())  # 0.89 > 0.8
    hopeless = CostAwarePolicy(predicting(0.99, 0.25, 0.99, 0.25), CostModel(0.5, {1: 0.1, 2: 0.2}))
    assert [hopeless.begin_round(50) for _ in range(20)] == [0] * 20  # even acceptance 1 would not pay


def test_cost_aware_policy_stops_drafting_when_drafting_rounds_lose_and_probes():
    """Rounds that drafted are weighed against plain rounds: N - t / T(1). Drafting rounds
    that lost (nothing accepted, a dearer round) stop the drafting; a one-token probe follows after
    ``probe_every`` plain rounds; rounds that paid keep it going."""
    losing = CostAwarePolicy(predicting(0.99, 0.25, 0.99, 0.25), gate_costs(), probe_every=4)
    assert losing.begin_round(50) == 8  # before any measurement: draft, and learn
    for _ in range(10):
        losing.observe(1, 0.0, 0.02, 0.16)
    assert [losing.begin_round(50) for _ in range(6)] == [0, 0, 0, 0, 1, 0]
    paying = CostAwarePolicy(predicting(0.99, 0.25, 0.99, 0.25), gate_costs(), probe_every=4)
    for _ in range(10):
        paying.observe(3, 3.0, 0.06, 0.22)
    assert all(paying.begin_round(50) == 8 for _ in range(4))


def test_each_ablation_of_the_cost_aware_policy_changes_its_one_rule():
    """benchmarks/policies.py's ablations: no first-draft gate; the next acceptance read as the current one's."""
    for cls, verified in ((CostAwarePolicy, False), (VerifyEveryFirstDraft, True)):
        policy = cls(predicting(0.5, 0.25, 0.99, 0.25), gate_costs())
        policy.begin_round(50)
        assert policy.propose_first(first_steps()[0], 1.0) == verified
    for cls, continued in ((CostAwarePolicy, False), (CurrentTokenAsNext, True)):
        policy = cls(predicting(0.99, 0.25, 0.7, 0.25), gate_costs())
        policy.begin_round(50)
        assert policy.decide(state()) == continued  # gain 0.99 * 0.7 < 0.8 < 0.99 * 0.99


def test_save_and_load_round_trip(tmp_path):
    nets = AcceptancePredictor(8), ValueNetwork(8), ValueNetwork(8)
    path = tmp_path / "policy.safetensors"
    metadata = dict(hidden=8, features=list(FEATURES), outputs=list(PREDICTOR_OUTPUTS), draft_step_s=0.01,
                    target_pass_s={"1": 0.1, "2": 0.12})
    save_policy(path, *nets, metadata)
    predictor, value, _, _ = load_policy(path)
    x = torch.randn(5, len(FEATURES))
    assert torch.equal(predictor(x), nets[0](x)) and torch.equal(value(x), nets[1](x))
    assert default_policy(path=path).costs.target(2) == pytest.approx(0.12)
    for older in (dict(features=list(FEATURES[:-1])), dict(outputs=list(PREDICTOR_OUTPUTS[:2]))):  # files of older versions
        save_policy(path, *nets, metadata | older)
        with pytest.raises(ValueError, match="retrain it"):
            load_policy(path)












@pytest.mark.parametrize("draft", ["feature", "token"])  # (the lookup's chooser: tests/policies/test_sources.py)
def test_shipped_policy_loads_with_its_calibration(draft):
    predictor, value, policy, metadata = load_policy(POLICY_FILES[draft])
    assert metadata["rows"] > 1000 and len(metadata["calibration"]) == len(metadata["next_calibration"]) == 10
    assert metadata["draft_step_s"] > 0 and metadata["target_pass_s"]["1"] > 0
    assert isinstance(default_policy("block", POLICY_FILES[draft]), CostAwarePolicy)


def test_the_oracle_is_not_a_user_policy():
    assert not any("oracle" in name.lower() for name in dir(specdec_fast))
