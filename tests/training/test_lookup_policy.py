"""train-policy --draft lookup: the traces replay the lookup and label each proposed token with
its exact acceptance probability; the fit learns what the labels say."""

from __future__ import annotations

import torch

from specdec_fast import fast_generate
from specdec_fast.drafts.lookup import PromptLookup
from specdec_fast.policies.baselines import FixedDraftLength
from specdec_fast.policies.sources import LOOKUP_FEATURES
from specdec_fast.training.lookup_policy import LookupRecorder, calibration, fit_acceptance

from helpers.models import NO_EOS, tiny_llama


def test_traces_label_each_looked_up_token():
    """Greedy labels are the 0/1 outcome of each token given the ones before; sampled labels are
    probabilities; the features say what the lookup matched and offered."""
    target = tiny_llama(10, vocab=16, context=256)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 3]
    for temperature in (0.0, 1.0):
        recorder = LookupRecorder(prompt, temperature, max_tokens=4)
        out = fast_generate(target, PromptLookup(max_tokens=4), prompt, max_new_tokens=30, temperature=temperature, seed=0,
                            policy=FixedDraftLength(4), on_round=recorder, eos_token_id=NO_EOS, guard=False)
        assert recorder.ids == prompt + out.tokens  # the replay followed the generation
        features, labels = torch.cat(recorder.features), torch.cat(recorder.labels)
        assert len(labels) == out.stats.drafted and features.shape == (len(labels), len(LOOKUP_FEATURES))
        column = lambda name: features[:, LOOKUP_FEATURES.index(name)]  # noqa: E731
        assert (column("matched") >= 1).all() and (column("position") <= column("offered")).all()
        assert (column("temperature") == temperature).all()
        assert ((labels >= 0) & (labels <= 1)).all()
        if temperature == 0.0:
            assert set(labels.tolist()) <= {0.0, 1.0}
            first = column("position") == 1  # a first token is accepted iff its label is 1
            assert labels[first].sum() >= 1


def test_the_fit_follows_the_labels():
    g = torch.Generator().manual_seed(0)
    features = torch.rand(2000, len(LOOKUP_FEATURES), generator=g) * torch.tensor([3.0, 8.0, 1.0, 1.0, 8.0])
    labels = torch.sigmoid(3 * (features[:, 0] - 1.5))  # the match length decides
    traces = dict(features=features, labels=labels)
    net = fit_acceptance(traces, torch.ones(2000, dtype=torch.bool), hidden=8, steps=400)
    rows = calibration(net, traces, torch.ones(2000, dtype=torch.bool), bins=2)
    assert rows[0]["predicted"] < 0.25 and rows[1]["predicted"] > 0.75
    assert all(abs(r["predicted"] - r["observed"]) < 0.05 for r in rows)
