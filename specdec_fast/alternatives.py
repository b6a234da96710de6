"""First-token alternatives: more candidates for a round's first drafted token, in the same target pass.

A round drafts its chain X_1..X_k as usual and, from the same draft distribution q_1, up to
``a`` further tokens A_1..A_a for the first position: at temperature 0 the draft's next
likeliest tokens, otherwise draws from q_1 without replacement (A_j ~ q_1 with X_1 and
A_1..A_{j-1} removed, renormalised). The target scores each A_j as a sibling of X_1 (it sees
the prefix, not X_1) in the verification pass, so an accepted alternative brings the target's
token after it too: two tokens from a round whose chain failed at its first token.

Verification (recursive rejection sampling: SpecTr, Sun et al. 2023; Jeon et al. 2024). X_1
is tested by the verify op as usual. If it is rejected, let r = norm(max(p_1 - q_1, 0)), the
residual a rejection leaves, and q' = q_1 without X_1, renormalised. Each A_j in turn is
accepted iff u_j q'(A_j) <= r(A_j); on its rejection r <- norm(max(r - q', 0)) and A_j leaves
q'. An accepted A_j is followed by Y ~ p at A_j; if every A_j is rejected, Y ~ r. Each test
is one token-wise step of a draw from q' against r, which leaves the emitted token
distributed as r whatever came before, so the first token follows p_1 exactly. At
temperature 0 p_1 is a point mass: A_j is accepted iff it is the target's argmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .reference.verify import RESIDUAL_EPS
from .sampling import sample_inverse_cdf


def draw_alternatives(logits: Tensor, q: Tensor, first: int, count: int, temperature: float,
                      generator: torch.Generator) -> Tensor:
    """Up to ``count`` first-position alternatives to the drafted token ``first``.

    logits [V]: the draft's logits at the first position; q [V] fp32: the warped distribution
    ``first`` was drawn from. Returns int64 [a], a <= count, distinct and != first, in draw order:
    at temperature 0 by descending logit, otherwise sampled from q without replacement (the top
    a of q / E with E ~ Exp(1) i.i.d., the exponential form of Gumbel top-a; tokens with q = 0
    are never drawn, so a may be short).
    """
    if temperature == 0:
        keys = logits.float().clone()
        keys[first] = float("-inf")
        return keys.topk(min(count, keys.numel() - 1)).indices
    race = torch.empty(q.shape, dtype=torch.float64).exponential_(generator=generator).to(q.device)
    keys = q.double() / race
    keys[first] = 0.0
    top = keys.topk(min(count, keys.numel())).indices
    return top[keys[top] > 0]


def verify_alternatives(p: Tensor, q: Tensor, first: int, alternatives: Tensor, uniforms: Tensor,
                        greedy: bool) -> tuple[int, int]:
    """The first emitted token of a round whose drafted X_1 = ``first`` was rejected.

    p [V]: the warped target at the first position (greedy: any scores whose argmax is the
    target's, e.g. its logits); q [V]: the warped draft distribution X_1 and the alternatives
    were drawn from; alternatives [a]; uniforms [a + 1] in (0, 1]; greedy: temperature 0.
    Returns (j, token): the accepted alternative's index and token, or (-1, Y ~ the final
    residual) when none is accepted.
    """
    if greedy:  # q is a point mass too, so the general rule has no q' to draw from
        best = int(p.argmax())
        hits = (alternatives == best).nonzero()
        return (int(hits[0, 0]), best) if len(hits) else (-1, best)
    r = _residual(p.double(), q.double())
    q_left = q.double().clone()
    q_left[first] = 0.0
    for j, token in enumerate(alternatives.tolist()):
        q_left = q_left / q_left.sum()
        if float(uniforms[j]) * float(q_left[token]) <= float(r[token]):
            return j, token
        r = _residual(r, q_left)
        q_left[token] = 0.0
    return -1, int(sample_inverse_cdf(r[None], uniforms[-1:].to(r.device))[0])


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(p - q, 0)), or p where that has no mass (the verify op's rule, see RESIDUAL_EPS)."""
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    return residual / total if total > RESIDUAL_EPS else p
