"""The hybrid's source chooser (specdec_fast/policies/sources.py): it looks up where the lookup's
expected rate beats the sequence's measured model rounds, with the length that maximises that
rate; a sequence's first round drafts with the model; the shipped file loads and is calibrated."""

from __future__ import annotations

import time

import torch

from specdec_fast.policies.costs import CostModel
from specdec_fast.policies.shipped import POLICY_FILES, default_sources
from specdec_fast.policies.sources import CostAwareSources, LookupAcceptance, expected_accepted, load_lookup_acceptance

COSTS = {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 5: 0.014, 6: 0.015, 7: 0.016, 8: 0.017, 9: 0.018}


def constant_acceptance(p: float) -> LookupAcceptance:
    """A network that predicts ``p`` for every lookup token."""
    net = LookupAcceptance()
    with torch.no_grad():
        for layer in net.net:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.zero_()
                layer.bias.zero_()
        net.net[-1].bias.fill_(float(torch.logit(torch.tensor(p))))
    return net


def chooser(p: float) -> CostAwareSources:
    return CostAwareSources(constant_acceptance(p), CostModel(1e-5, dict(COSTS)))


def test_expected_accepted_is_the_sum_of_survivals():
    assert expected_accepted(torch.tensor([0.5, 0.5, 1.0])).tolist() == [0.5, 0.75, 1.0]


def test_a_sequence_first_drafts_with_the_model_then_compares_rates():
    sources = chooser(0.9)
    sources.reset(2)
    matched, offered, t = torch.tensor([3, 0]), torch.tensor([8, 0]), torch.zeros(2)
    looked_up, _ = sources.choose(matched, offered, t)
    assert looked_up.tolist() == [False, False]  # no model rate measured yet
    time.sleep(0.02)
    sources.observe(torch.tensor([0, 0]))  # model rounds of ~20 ms emitting one token: ~50 tokens/s
    looked_up, lengths = sources.choose(matched, offered, t)
    length, rate = sources.lookup_plan(3, 8, 0.0, sources.recent[0])
    assert looked_up.tolist() == [True, False] and int(lengths[0]) == length == 8 and rate > sources.model_rate[0]
    sources.observe(torch.tensor([8, 0]))
    assert sources.recent[0] > 0.5  # all 8 accepted


def test_a_poor_lookup_loses_to_the_model_and_picks_a_short_length():
    sources = chooser(0.05)
    sources.reset(1)
    sources.model_rate = [1.0 / 0.010]  # the plain pass's rate: a lookup accepting 5% of its tokens cannot beat it
    looked_up, _ = sources.choose(torch.tensor([2]), torch.tensor([8]), torch.ones(1))
    assert not bool(looked_up[0])
    assert sources.lookup_plan(2, 8, 1.0, 0.5)[0] == 1  # more tokens only make the pass longer


def test_rows_are_selected_with_the_batch():
    sources = chooser(0.5)
    sources.reset(3)
    sources.model_rate = [1.0, 2.0, 3.0]
    sources.select([2, 0])
    assert sources.model_rate == [3.0, 1.0] and len(sources.recent) == 2


def test_the_shipped_chooser_loads_and_was_calibrated():
    net, metadata = load_lookup_acceptance(POLICY_FILES["lookup"])
    assert metadata["rows"] > 1000 and set(metadata["temperatures"]) == {0.0, 1.0}
    for row in metadata["calibration"]:  # held-back prompts: predicted within 0.1 of observed
        assert abs(row["predicted"] - row["observed"]) < 0.1
    sources = default_sources()
    high = sources.lookup_plan(3, 8, 0.0, 0.9)
    low = sources.lookup_plan(1, 8, 1.0, 0.1)
    assert high[1] > low[1] and high[0] >= low[0]  # a long match, greedy, with a good record: a longer, better lookup
