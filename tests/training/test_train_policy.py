"""train-policy: traces label each drafted token, the predictor's standardisation, fitted value
iteration and the throughput it is scored by."""

from __future__ import annotations

import pytest
import torch

from specdec_fast.policies.learned import PREDICTOR_OUTPUTS
from specdec_fast.policies.mdp import FEATURES
from specdec_fast.training.policy import collect_traces, fit_predictor, fit_value_networks, trace_throughput

from helpers.models import CharTokenizer, tiny_llama


def test_traces_label_each_drafted_token():
    """train-policy's traces: one row of features per decided draft token, labelled with its acceptance
    probability (at T = 0 the 0/1 outcome); greedy rows carry the draft's temperature-1 confidence."""
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    traces = collect_traces(target, draft, CharTokenizer(), ["ab", "hello"], [0.0, 1.0], max_new_tokens=12, max_draft=3)
    n = len(traces["accept"])
    assert n > 10 and traces["features"].shape == (n, len(FEATURES)) and traces["prompt"].unique().tolist() == [0, 1]
    column = lambda name: traces["features"][:, FEATURES.index(name)]  # noqa: E731
    greedy = column("temperature") == 0
    assert 0 < greedy.sum() < n
    assert set(traces["accept"][greedy].tolist()) <= {0.0, 1.0}
    assert ((traces["accept"] >= 0) & (traces["accept"] <= 1)).all() and traces["accept"][~greedy].unique().numel() > 2
    assert (column("entropy")[greedy] > 0).all() and (column("top1")[greedy] < 1).all()
    assert (column("position") < 3).all()  # the last token of a round is followed by no decision
    same_round = traces["round"][1:] == traces["round"][:-1]  # the next token's labels are the following row's
    for name in ("accept", "ratio"):
        assert torch.equal(traces[f"next_{name}"][:-1][same_round], traces[name][1:][same_round])
    assert ((traces["next_accept"] >= 0) & (traces["next_accept"] <= 1)).all()


def test_predictor_ignores_a_feature_constant_in_its_traces():
    """Survival is 1 in every trace; the cost-aware policy's survival drops below 1 within a round,
    which must not move the prediction (it once drove every prediction to 1)."""
    g = torch.Generator().manual_seed(0)
    features = torch.rand(400, len(FEATURES), generator=g)
    features[:, FEATURES.index("survival")] = 1.0
    traces = dict(features=features) | {name: torch.rand(400, generator=g) for name in PREDICTOR_OUTPUTS}
    predictor = fit_predictor(traces, torch.ones(400, dtype=torch.bool), hidden=8)
    moved = features[:5].clone()
    moved[:, FEATURES.index("survival")] = 0.3
    assert torch.equal(predictor(moved), predictor(features[:5]))


class Constant(torch.nn.Module):
    """A stand-in network: the same output for every state (> 0: always CONTINUE)."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x):
        return torch.full((len(x),), self.value)


def test_value_iteration_learns_when_one_more_draft_pays():
    """Synthetic traces of rounds of 3 decisions where the next token is accepted iff the current
    one's "top1" > 0.5 (and all so far were): continuing pays exactly there (gain 1 token against
    lambda x 0.02 s, lambda ~ 10-20 tokens/s). The value and policy networks must learn that rule
    on held-out rounds, the last decision of a round included (nothing follows it), and it must
    beat always stopping after the first token on the same traces."""
    g = torch.Generator().manual_seed(0)
    rounds, length = 300, 3
    features = torch.rand(rounds * length, len(FEATURES), generator=g)
    good = features[:, FEATURES.index("top1")] > 0.5  # the next token will be accepted
    accept, survival = torch.ones(rounds * length), torch.ones(rounds * length)  # survival: all so far accepted
    for row in range(rounds * length):
        if row % length:
            accept[row] = float(good[row - 1])
            survival[row] = survival[row - 1] * accept[row]
    features[:, FEATURES.index("position")] = torch.arange(length).repeat(rounds) + 1.0
    features[:, FEATURES.index("survival")] = survival
    rows = torch.arange(rounds).repeat_interleave(length)
    traces = dict(features=features, accept=accept, next_accept=good.float(), ratio=accept / 4, next_ratio=good / 4,
                  round=rows, prompt=rows % 5)
    costs = dict(draft_step_s=0.01, target_pass_s={n: 0.1 + 0.01 * (n - 1) for n in range(1, 6)})
    train = traces["prompt"] != 4
    value, policy, throughput = fit_value_networks(traces, train, costs, hidden=16)
    for position in range(1, length + 1):
        held = ~train & (features[:, FEATURES.index("position")] == position)
        pays = good[held] & (survival[held] > 0)
        assert 0.1 < pays.float().mean() < 0.9
        with torch.no_grad():
            assert ((value(features[held]) > 0) == pays).float().mean() > 0.9
            assert ((policy(features[held]) > 0) == pays).float().mean() > 0.9
    assert throughput > 1.1 * trace_throughput(traces, train, Constant(-1.0), costs)  # stop after one token


def test_trace_throughput_counts_the_token_drafted_after_the_last_decision():
    # Round 0: two decisions (tokens 1, 2 drafted; accepted w.p. 1 and 0.5); round 1: one decision.
    traces = dict(features=torch.zeros(3, len(FEATURES)), accept=torch.tensor([1.0, 0.5, 0.8]),
                  next_accept=torch.tensor([0.5, 0.25, 0.4]), round=torch.tensor([0, 0, 1]))
    costs = dict(draft_step_s=0.01, target_pass_s={n: 0.1 + 0.01 * n for n in range(1, 6)})
    rows = torch.ones(3, dtype=torch.bool)
    always = (2.625 + 2.12) / (3 * 0.01 + 0.14 + 2 * 0.01 + 0.13)  # 1 + 1 + 0.5 + 0.5 x 0.25; 1 + 0.8 + 0.8 x 0.4
    assert trace_throughput(traces, rows, Constant(1.0), costs) == pytest.approx(always)
    assert trace_throughput(traces, rows, Constant(-1.0), costs) == pytest.approx((2 + 1.8) / (2 * (0.01 + 0.12)))
