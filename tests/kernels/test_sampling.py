"""The warping and sampling rules of specdec_fast.sampling (the spec every backend follows)."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import draft_step, warp_logits
from specdec_fast.kernels import SamplingParams
from specdec_fast.kernels.sampling import entropy, sample_inverse_cdf

from helpers.distribution import chi_square, counts


def warp(logits, temperature=1.0, top_k=0, top_p=1.0):
    n = logits.shape[:-1]
    return warp_logits(logits, torch.full(n, temperature), torch.full(n, top_k, dtype=torch.int64), torch.full(n, top_p))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 10, 1.0), (1.3, 0, 0.9), (0.8, 20, 0.75)])
def test_matches_transformers_warpers(temperature, top_k, top_p):
    """Same distribution as transformers' temperature -> top-k -> top-p warpers (no ties here)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(16, 401, generator=torch.Generator().manual_seed(0)) * 3
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    torch.testing.assert_close(warp(logits, temperature, top_k, top_p), torch.softmax(scores, -1), rtol=1e-5, atol=1e-7)


def test_top_k_keeps_ties():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    assert (warp(logits, top_k=2) > 0).tolist() == [[True, False, True, True, False]]


def test_top_p_keeps_ties_and_matches_definition():
    """Kept iff the mass strictly above p(x) is < top_p, checked by brute force on random rows with ties."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 6, (200, 30), generator=g).float()  # many ties
    for top_p in (0.3, 0.5, 0.9):
        kept = warp(logits, top_p=top_p) > 0
        p = torch.softmax(logits, -1)
        mass_above = (p[:, None, :] * (p[:, None, :] > p[:, :, None])).sum(-1)
        assert torch.equal(kept, mass_above < top_p)


def test_greedy_is_point_mass_on_first_argmax():
    logits = torch.tensor([[1.0, 5.0, 5.0, -1.0]])
    assert warp(logits, temperature=0.0).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_inverse_cdf_never_draws_zero_weight():
    w = torch.tensor([[0.0, 0.0, 0.3, 0.0, 0.7, 0.0]]).expand(5, 6)
    u = torch.tensor([1e-9, 0.3, 0.30001, 0.999, 1.0])
    assert sample_inverse_cdf(w, u).tolist() == [2, 2, 4, 4, 4]


def test_entropy_handles_zeros():
    q = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(entropy(q), torch.tensor([0.6931472, 0.0]))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 1.0), (1.5, 0, 0.8)])
def test_draft_step_samples_q_and_reports_features(temperature, top_k, top_p):
    n, v = 20_000, 12
    logits = torch.randn(v, generator=torch.Generator().manual_seed(2)).expand(n, v)
    out = draft_step(logits, sampling=SamplingParams(temperature, top_k, top_p), generator=torch.Generator().manual_seed(3))
    q = warp(logits[:1], temperature, top_k, top_p)[0]
    torch.testing.assert_close(out.probs, q.expand(n, v))
    stat, threshold, _ = chi_square(counts(out.tokens, v), q)
    assert stat < threshold
    torch.testing.assert_close(out.token_prob, q[out.tokens])
    torch.testing.assert_close(out.entropy, entropy(q).expand(n))
    torch.testing.assert_close(out.top1_prob, q.max().expand(n))


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 0.9)])
def test_draft_step_greedy(top_k, top_p):
    """q is the point mass on the argmax; the features describe the distribution at temperature 1."""
    logits = torch.randn(5, 33, generator=torch.Generator().manual_seed(4))
    out = draft_step(logits, sampling=SamplingParams(0.0, top_k, top_p))
    assert torch.equal(out.tokens, logits.argmax(-1))
    assert torch.equal(out.probs, torch.nn.functional.one_hot(out.tokens, 33).float())
    p = warp(logits, 1.0, top_k, top_p)
    torch.testing.assert_close(out.token_prob, p.max(-1).values)
    torch.testing.assert_close(out.top1_prob, p.max(-1).values)
    torch.testing.assert_close(out.entropy, entropy(p))
    assert (out.entropy > 0.5).all() and (out.top1_prob < 0.9).all()
