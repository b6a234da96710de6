"""Sampling math shared by every op and backend (pure torch, the specification).

Warping turns logits into the distribution a token is drawn from; the draft and the
target are warped with the same parameters. The rules, normative for every backend:

- temperature 0 is greedy: a point mass on the first argmax of the logits;
- top-k (``top_k <= 0`` or ``>= V`` disables it) keeps x iff fewer than k logits are
  strictly greater than logit(x): ties at the boundary are all kept;
- top-p (``top_p >= 1`` disables it) keeps x iff the probability mass strictly greater
  than p(x) is below top_p: again tie-inclusive and independent of sort order;
- order: temperature, top-k, softmax, top-p, renormalise (as transformers' warpers); the
  softmax and renormalisation in float64, the result rounded once to fp32;
- a token is drawn by inverse CDF from one uniform u in (0, 1]: the smallest x with
  cumsum(w)[x] >= u * sum(w), the sums in float64 (so that backends adding in another
  order still draw the same token). Tokens of weight 0 are never drawn;
- uniforms come from the caller, from torch.Generators, or from a per-request counter
  (Philox4x32-10 on (seed, offset + i)), which no other request in the batch affects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

Generators = torch.Generator | Sequence[torch.Generator] | None


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn, for one request or for each row of a batch.

    temperature: 0 is greedy (a point mass on the first argmax), else the logits' divisor;
    top_k: keep the k largest logits (ties at the boundary kept; 0 disables it);
    top_p: keep the smallest head of the distribution with mass >= top_p (ties kept; 1 disables it).
    Each is one number for every row, or one value per row (a sequence or a [B] tensor).
    The draft and the target are warped with the same settings.
    """

    temperature: float | Sequence[float] | Tensor = 1.0
    top_k: int | Sequence[int] | Tensor = 0
    top_p: float | Sequence[float] | Tensor = 1.0

    def __post_init__(self) -> None:
        t, k, p = (torch.as_tensor(v, dtype=torch.float64) for v in (self.temperature, self.top_k, self.top_p))
        if not bool(((t >= 0) & torch.isfinite(t)).all()):
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {self.temperature}")
        if not bool(((k >= 0) & (k == k.round())).all()):
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if not bool(((p > 0) & (p <= 1)).all()):
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if any(v.dim() > 1 for v in (t, k, p)):
            raise ValueError("sampling settings must be scalars or one value per row ([B])")

    @property
    def per_row(self) -> bool:
        """Does any setting hold one value per row?"""
        return not all(_is_scalar(v) for v in (self.temperature, self.top_k, self.top_p))

    def as_tensors(self, batch: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
        """Per-row tensors (temperature [B] fp32, top_k [B] int64, top_p [B] fp32); ValueError if a
        per-row setting does not have B values."""
        out = []
        for name, value, dtype in (("temperature", self.temperature, torch.float32), ("top_k", self.top_k, torch.int64),
                                   ("top_p", self.top_p, torch.float32)):
            t = torch.as_tensor(value, dtype=dtype, device=device)
            if t.dim() == 0:
                t = t.expand(batch)
            if t.shape != (batch,):
                raise ValueError(f"{name} must be a scalar or have shape [B] = [{batch}], got {tuple(t.shape)}")
            out.append(t)
        return tuple(out)

    def rows(self, index: Sequence[int]) -> "SamplingParams":
        """The settings of the rows ``index`` (the requests still running in a batch)."""
        if not self.per_row:
            return self
        pick = lambda v: v if _is_scalar(v) else torch.as_tensor(v)[list(index)]  # noqa: E731
        return SamplingParams(pick(self.temperature), pick(self.top_k), pick(self.top_p))


def _is_scalar(value) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, Tensor) and value.dim() == 0)


def warp_logits(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """The warped distribution of each row.

    Shape: logits [..., V] (any float dtype); temperature, top_k, top_p [...] (one per row).
    Returns fp32 probabilities [..., V], each row summing to 1.
    """
    shape, vocab = logits.shape, logits.shape[-1]
    x = logits.reshape(-1, vocab).float()
    t, k, p = temperature.reshape(-1).float(), top_k.reshape(-1), top_p.reshape(-1).float()
    greedy = t == 0
    x = x / torch.where(greedy, 1.0, t)[:, None]

    use_top_k = (k > 0) & (k < vocab)
    if use_top_k.any():
        kth = x.topk(int(k[use_top_k].max()), dim=-1).values
        kth = kth.gather(-1, (k.clamp(1, kth.shape[-1]) - 1)[:, None])
        x = x.masked_fill(use_top_k[:, None] & (x < kth), float("-inf"))
    # In float64, rounded to fp32 once at the end: an fp32 softmax sums V terms with an
    # error of ~1e-5 at V = 262,144, which would move every sampling boundary.
    probs = torch.softmax(x.double(), dim=-1)

    use_top_p = p < 1
    if use_top_p.any():
        sorted_p = probs.sort(dim=-1, descending=True).values
        mass_before = sorted_p.cumsum(-1) - sorted_p
        n_keep = (mass_before < p.double()[:, None]).sum(-1, keepdim=True)  # >= 1: mass_before[0] == 0
        threshold = sorted_p.gather(-1, n_keep - 1)
        probs = probs.masked_fill(use_top_p[:, None] & (probs < threshold), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)

    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.reshape(-1, vocab).argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs.float().reshape(shape)


def sample_inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Draw one token per row from unnormalised non-negative ``weights`` [N, V] with uniforms ``u`` [N] in (0, 1].

    Returns int64 [N]: the smallest x with cumsum(weights)[x] >= u * sum(weights), in float64.
    """
    cdf = weights.double().cumsum(-1)
    # The total is the cdf's own last entry, so u = 1 lands on the last token of positive weight.
    return torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None]).squeeze(-1).clamp_(max=weights.shape[-1] - 1)


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats of each row of ``probs`` [..., V] (0 log 0 = 0). Returns [...]."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def draw_uniforms(batch: int, n: int, generator: Generators = None, device: torch.device | str = "cpu") -> Tensor:
    """Uniforms in (0, 1] of shape [batch, n] (never 0, as the acceptance test needs).

    ``generator`` is one ``torch.Generator`` for the whole batch, or one per row so that a
    request's randomness does not depend on the rest of the batch.
    """
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        u = torch.rand(batch, n, generator=generator, device=gen_device)
    else:
        if len(generator) != batch:
            raise ValueError(f"got {len(generator)} generators for a batch of {batch}")
        u = torch.stack([torch.rand(n, generator=g, device=g.device) for g in generator])
    return (1.0 - u).to(device)
