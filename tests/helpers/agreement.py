"""Comparing a kernel's draws with the reference's on the same uniforms.

fp32 probabilities computed in another order differ in their last bits, which moves each
inverse-CDF boundary by ~1e-8 of the total: a uniform that lands that close to a boundary
can legitimately draw the neighbouring token. The stated tolerance: every row has the
reference's accepted count and tokens, except that the emitted (last) token may differ from
the reference's when the target probability mass between the two is at most 1e-6. Such
near-ties must stay rare (at most 2 rows, or one in 50).
"""

from __future__ import annotations

import torch

TOLERANCE = 1e-6


def assert_same_draws(ref, out, target_probs: torch.Tensor) -> int:
    """ref, out: VerifyOutputs (reference, kernel); target_probs: [B, K+1, V] the warped target.

    Returns the number of near-tie rows; raises AssertionError on any other difference."""
    tokens, accepted = out.tokens.cpu(), out.num_accepted.cpu()
    assert torch.equal(ref.num_accepted, accepted), f"accepted counts differ: {ref.num_accepted} vs {accepted}"
    differ = (ref.tokens != tokens).any(-1).nonzero().flatten().tolist()
    for row in differ:
        j = int(accepted[row])
        same_prefix = torch.equal(ref.tokens[row, :j], tokens[row, :j]) and torch.equal(ref.tokens[row, j + 1 :], tokens[row, j + 1 :])
        a, b = sorted((int(ref.tokens[row, j]), int(tokens[row, j])))
        between = target_probs[row, j, a:b].double().sum().item()  # mass of [a, b): the CDF distance
        assert same_prefix and between <= TOLERANCE, (
            f"row {row} differs: {ref.tokens[row]} vs {tokens[row]} (mass between the emitted tokens {between:.3g})")
    assert len(differ) <= max(2, len(tokens) // 50), f"too many near-ties: rows {differ}"
    return len(differ)
