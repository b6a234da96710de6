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

import time

import torch
from torch import Tensor

from ..kernels import SamplingParams, draft_step, warp_logits
from ..kernels.reference.verify import RESIDUAL_EPS
from ..kernels.sampling import draw_uniforms, sample_inverse_cdf
from ..models.batched_lm import OneSequence
from ..policies.mdp import DraftPolicy
from .requests import Request
from .round import Round, chain_feed, commit, count_seconds, draft_chain, roll_back, round_uniforms, verify_drafts


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


def check_alternatives(count: int, verifier: str, target_lm, draft_lm=None) -> None:
    """``count`` alternatives are possible: a non-negative integer, token-wise verification, a
    target with sibling passes, and a draft with a distribution to draw them from (not a lookup)."""
    if int(count) != count or count < 0:
        raise ValueError(f"num_alternatives must be a non-negative integer, got {count}")
    if count and verifier != "token":
        raise ValueError(f"first-token alternatives need verifier='token', got {verifier!r}")
    if count and not hasattr(target_lm, "extend_siblings"):
        raise ValueError(f"first-token alternatives need a target with extend_siblings and keep_sibling; "
                         f"{type(target_lm).__name__} has neither")
    if count and hasattr(draft_lm, "plan_lengths"):
        raise ValueError("first-token alternatives need a draft with a distribution; a lookup draft proposes one token")


def try_alternatives(p_logits: Tensor, sibling_logits: Tensor, q: Tensor, first: int, alternatives: Tensor,
                     sampling: SamplingParams, generator: torch.Generator) -> tuple[int, list[int]]:
    """After X_1 = ``first`` was rejected: (accepted alternative or -1, the round's emitted tokens),
    the alternative and the target's token after it, or one token from the residual."""
    a, greedy = len(alternatives), sampling.temperature == 0
    u = draw_uniforms(1, a + 2, generator)[0]
    p = p_logits if greedy else warp_logits(p_logits[None], *sampling.as_tensors(1, p_logits.device))[0]
    sibling, token = verify_alternatives(p, q.to(p.device), first, alternatives, u[: a + 1], greedy)
    if sibling < 0:
        return sibling, [token]
    bonus = draft_step(sibling_logits[sibling][None], sampling=sampling, uniforms=u[a + 1 :])
    return sibling, [token, int(bonus.tokens)]


def alternatives_round(target: OneSequence, draft: OneSequence, seq: Request, k: int, count: int,
                       sampling: SamplingParams, eos: set[int], policy: DraftPolicy | None = None) -> Round:
    """:func:`~specdec_fast.decoding.round.speculative_round` for one sequence, with up to ``count``
    alternatives to the first drafted token scored in the same target pass (token-wise only)."""
    start = time.perf_counter()
    lens = [min(k, seq.remaining - 1)]
    u_draft, u_verify = round_uniforms([seq], lens)
    drafts = draft_chain(draft, [seq], lens, u_draft, sampling, eos, policy)
    alternatives = torch.zeros(0, dtype=torch.int64)
    if drafts.lens[0]:
        alternatives = draw_alternatives(drafts.first_logits[0], drafts.probs[0, 0], int(drafts.tokens[0, 0]), count,
                                         float(sampling.temperature), seq.generator)

    target_start = time.perf_counter()
    feed, a = chain_feed([seq], drafts)[0], len(alternatives)
    logits = target.lm.extend_siblings(feed, alternatives, 1, len(feed)) if a else target.lm.extend(feed, len(feed))
    target_logits, sibling_logits = logits[None, : len(feed)], logits[len(feed) :]

    verify_start = time.perf_counter()
    verified = verify_drafts(target_logits, drafts, u_verify, sampling, "token")
    sibling, emitted = -1, verified.tokens[0][: verified.accepted[0] + 1]
    if verified.accepted[0] == 0 and a:
        sibling, emitted = try_alternatives(target_logits[0, 0], sibling_logits, verified.draft_probs[0, 0],
                                            int(drafts.tokens[0, 0]), alternatives, sampling, seq.generator)
    if sibling >= 0:  # the target's cache keeps the alternative, moved into place
        target.lm.keep_sibling(len(seq.ids) + 1, target.lm.cache_length - a + sibling)
    else:
        roll_back(target, [seq], verified.accepted)
    roll_back(draft, [seq], verified.accepted)
    committed = commit([seq], drafts, verified.accepted, [emitted], eos)
    seq.stats.alternatives += a
    seq.stats.alternatives_accepted += sibling >= 0
    return Round(drafts, verified, committed, *count_seconds([seq], start, target_start, verify_start))
