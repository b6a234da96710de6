"""Token-wise verification, reference (Leviathan et al. 2023; Chen et al. 2023).

For each row b with L = draft_lens[b] drafted tokens X_1..X_L, X_i ~ q_i:

- accept X_i iff u_i * q_i(X_i) <= p_i(X_i), i.e. with probability min(1, p_i/q_i);
  q_i(X_i) == 0 cannot come from sampling q_i, so it is rejected;
- at the first rejection j emit Y ~ norm(max(0, p_j - q_j)); if that residual has no
  mass (p_j == q_j) emit Y ~ p_j. "No mass" means below RESIDUAL_EPS: fp32 rounding
  leaves ~1e-7 of noise where p == q, and a token drawn from noise is arbitrary. The
  rule changes the output distribution by at most P(reject) <= the residual mass;
- if all L are accepted emit the bonus Y ~ p_{L+1};
- greedy rows (temperature 0) need no special case: warping makes p_i a point mass
  on argmax, so X_i is accepted iff it is the argmax and Y is the argmax at the stop.

A point-mass row (a draft that proposes fixed tokens, such as a prompt lookup) has
q_i = one-hot(X_i): X_i is accepted iff u_i <= p_i(X_i), and the residual at a rejection
is p_j with X_j's entry set to 0. The reference builds that q; the kernels never read one.

Every row emits between 1 and L + 1 tokens, distributed exactly as the target's.
Inputs that cannot be verified give a non-zero ``status`` (see STATUS) instead of raising;
``specdec_fast.kernels.ops.verify`` turns it into a ValueError.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..sampling import sample_inverse_cdf, warp_logits

RESIDUAL_EPS = 1e-6

# A row's status, the first problem found in the order below (every backend uses these codes).
# The reference checks every row a kernel could read: target rows 0..L, draft rows 0..L-1.
# The kernels check the rows they do read, so a bad value in a row past the stop may pass.
STATUS = {
    1: "draft_lens must lie in [0, K]",
    2: "draft_tokens has a drafted token outside [0, V)",
    3: "uniforms must lie in (0, 1]: a uniform of exactly 0 would accept any draft token",
    4: "target contains NaN",
    5: "target contains +inf",
    6: "target has a row where every logit is -inf",
    7: "draft_probs must hold finite non-negative probabilities (it contains NaN, a negative or an infinite value)",
}


class VerifyOutput(NamedTuple):
    """Result of verifying a batch of B drafts of up to K tokens.

    num_accepted [B] int64: accepted draft tokens, in [0, draft_lens];
    tokens [B, K+1] int64: the emitted tokens (accepted drafts, then the resampled or
        bonus token), padded with -1;
    num_emitted [B] int64: num_accepted + 1.
    """

    num_accepted: Tensor
    tokens: Tensor
    num_emitted: Tensor


def verify_reference(
    target_logits: Tensor,  # [B, K+1, V]
    draft_probs: Tensor | None,  # [B, K, V] the warped q each draft token was drawn from; None: every row a point mass
    point_mass: Tensor,  # [B] bool: the row's q is one-hot(X_i) (its draft_probs row is not read)
    draft_tokens: Tensor,  # [B, K] int64
    draft_lens: Tensor,  # [B] int64 in [0, K]
    temperature: Tensor,  # [B]
    top_k: Tensor,  # [B]
    top_p: Tensor,  # [B]
    uniforms: Tensor,  # [B, K+1] in (0, 1]: K acceptance tests, then one for the emitted sample
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (num_accepted [B], tokens [B, K+1], num_emitted [B], status [B]), all int64."""
    v = checked_inputs(target_logits, draft_probs, point_mass, draft_tokens, draft_lens, temperature, top_k, top_p,
                       uniforms)
    batch, k = v.tokens.shape
    rows = torch.arange(batch, device=target_logits.device)
    accept = v.drafted & (v.q_x > 0) & (uniforms[:, :k] * v.q_x <= v.p_x)
    num_accepted = accept.long().cumprod(-1).sum(-1)  # accepted prefix: stops at the first rejection

    j = num_accepted
    p_j = v.p[rows, j]  # [B, V]
    rejected = j < v.lens
    q_j = v.q[rows, j.clamp(max=k - 1)] * rejected[:, None] if k > 0 else torch.zeros_like(p_j)  # 0 for the bonus
    residual = (p_j - q_j).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > RESIDUAL_EPS, residual, p_j)
    y = sample_inverse_cdf(residual, uniforms[:, k])
    return num_accepted, emitted_tokens(v.tokens, num_accepted, y), num_accepted + 1, v.status


class CheckedInputs(NamedTuple):
    """What both verifiers start from, with bad entries replaced so that the math runs (their
    rows' status says what was wrong)."""

    p: Tensor  # [B, K+1, V] the warped target
    q: Tensor  # [B, K, V] the draft's q, one-hot rows for point masses
    tokens: Tensor  # [B, K] X_i, 0 where nothing was drafted
    lens: Tensor  # [B] clamped to [0, K]
    drafted: Tensor  # [B, K] bool: i < L
    p_x: Tensor  # [B, K] p_i(X_i)
    q_x: Tensor  # [B, K] q_i(X_i)
    status: Tensor  # [B] int64, see STATUS


def checked_inputs(target_logits: Tensor, draft_probs: Tensor | None, point_mass: Tensor, draft_tokens: Tensor,
                   draft_lens: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniforms: Tensor) -> CheckedInputs:
    """The verify op's arguments (see verify_reference) checked row by row (the status) and made
    ready for both verifiers: p warped, q with one-hot rows for point masses, tokens in range."""
    batch, k_plus_1, vocab = target_logits.shape
    k, device = k_plus_1 - 1, target_logits.device
    lens = draft_lens.clamp(0, k)
    drafted = torch.arange(k, device=device)[None, :] < lens[:, None]
    tokens = torch.where(drafted, draft_tokens, 0)
    readable = torch.arange(k_plus_1, device=device)[None, :] <= lens[:, None]  # target rows 0..L
    x = target_logits.float()
    row_max = torch.where(readable, x.amax(-1), 0.0)  # max propagates NaN; +inf (-inf) iff a +inf (only -inf)
    one_hot = lambda: torch.zeros(batch, k, vocab, device=device).scatter_(-1, tokens.clamp(0, vocab - 1)[..., None], 1.0)  # noqa: E731
    if draft_probs is None:
        q, bad_q = one_hot(), torch.zeros(batch, dtype=torch.bool, device=device)
    else:
        q = draft_probs.float()
        valid = (q.amin(-1) >= 0) & (q.amax(-1) < float("inf"))  # amin and amax propagate NaN
        bad_q = (drafted & ~point_mass[:, None] & ~valid).any(-1)
        if bool(point_mass.any()):  # (the reference may sync: it is the specification, not a kernel)
            q = torch.where(point_mass[:, None, None], one_hot(), q)
    checks = [
        (draft_lens < 0) | (draft_lens > k),
        (drafted & ((draft_tokens < 0) | (draft_tokens >= vocab))).any(-1),
        ~((uniforms > 0) & (uniforms <= 1)).all(-1),
        row_max.isnan().any(-1),
        (row_max == float("inf")).any(-1),
        (row_max == float("-inf")).any(-1),
        bad_q,
    ]
    status = torch.zeros(batch, dtype=torch.int64, device=device)
    for code, failed in reversed(list(enumerate(checks, 1))):  # the first failing check wins
        status = torch.where(failed, code, status)
    tokens = tokens.clamp(0, vocab - 1)
    if bool(status.any()):  # a bad row's outputs are undefined: zeros keep its math finite
        bad = (status > 0)[:, None, None]
        x, q = torch.where(bad, 0.0, x), torch.where(bad, 0.0, q)
    expand = lambda t: t[:, None].expand(batch, k_plus_1)  # noqa: E731
    p = warp_logits(x, expand(temperature), expand(top_k), expand(top_p))
    p_x = p[:, :k].gather(-1, tokens[..., None]).squeeze(-1)
    q_x = q.gather(-1, tokens[..., None]).squeeze(-1)
    return CheckedInputs(p, q, tokens, lens, drafted, p_x, q_x, status)


def emitted_tokens(draft_tokens: Tensor, num_accepted: Tensor, y: Tensor) -> Tensor:
    """[B, K+1]: the first num_accepted drafts of each row, then y, then -1."""
    batch, k = draft_tokens.shape
    positions = torch.arange(k + 1, device=draft_tokens.device)[None, :]
    drafts = torch.cat([draft_tokens, torch.full((batch, 1), -1, device=draft_tokens.device)], 1)
    tokens = torch.where(positions < num_accepted[:, None], drafts, -1)
    return torch.where(positions == num_accepted[:, None], y[:, None], tokens)
