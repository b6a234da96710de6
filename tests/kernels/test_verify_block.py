"""Block verification beyond the chi-square grid of test_verify.py: the toy case of
DESIGN.md by exact enumeration, and never fewer accepted tokens than token-wise."""

from __future__ import annotations

import pytest
import torch
from test_verify import BACKENDS, verifier, verify_on

from helpers.markov import make_pair, run_trials

GRID = 400  # uniforms at the midpoints of a GRID x GRID grid: the expectation up to O(1/GRID)


def expected_accepted(backend: str, rule: str, p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """E[accepted] for i.i.d. positions (target p, draft q at every position), enumerating every
    draft sequence exactly and the uniforms on a grid."""
    vocab = len(p)
    points = (torch.arange(GRID) + 0.5) / GRID
    u = torch.cartesian_prod(*[points] * k) if k > 1 else points[:, None]
    n = len(u)
    total = 0.0
    for drafts in torch.cartesian_prod(*[torch.arange(vocab)] * k).reshape(-1, k):
        weight = float(q[drafts].prod())
        out = verify_on(backend, p.log().expand(n, k + 1, vocab), q.expand(n, k, vocab), drafts.expand(n, k),
                        uniforms=torch.cat([u, torch.full((n, 1), 0.5)], 1), verifier=rule)
        total += weight * out.num_accepted.double().mean().item()
    return total


@pytest.mark.parametrize("backend", BACKENDS)
def test_toy_case_block_accepts_eleven_ninths(backend):
    """q = (2/3, 1/3), p = (1/3, 2/3), k = 2: block 11/9 tokens, token-wise 10/9 (DESIGN.md)."""
    p, q = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    assert expected_accepted(backend, "token", p, q, 2) == pytest.approx(10 / 9, abs=2 / GRID)
    assert expected_accepted(backend, "block", p, q, 2) == pytest.approx(11 / 9, abs=2 / GRID)


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_accepts_at_least_as_many_as_token_wise(backend):
    """On a position-dependent pair, block's mean accepted length is not below token-wise's
    (20,000 rounds each, ragged draft lengths 0..5; 4 standard errors of slack)."""
    pair = make_pair(5, 16, 1.0, 0, 1.0, seed=21)
    means, errors = {}, {}
    for rule in ("token", "block"):
        accepted = []
        record = verifier(pair, backend, rule)

        def keep(*args):
            out = record(*args)
            accepted.append(out.num_accepted)
            return out

        run_trials(pair, keep, 20_000, seed=22)
        a = torch.cat(accepted).double()
        means[rule], errors[rule] = a.mean().item(), a.std().item() / len(a) ** 0.5
    assert means["block"] >= means["token"] - 4 * (errors["block"] ** 2 + errors["token"] ** 2) ** 0.5
