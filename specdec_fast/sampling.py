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
    """Sampling parameters of one request. ``temperature=0`` means greedy decoding."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and self.temperature != float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")

    def as_tensors(self, batch: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
        """Per-row tensors (temperature [B] fp32, top_k [B] int64, top_p [B] fp32)."""
        return (
            torch.full((batch,), float(self.temperature), dtype=torch.float32, device=device),
            torch.full((batch,), int(self.top_k), dtype=torch.int64, device=device),
            torch.full((batch,), float(self.top_p), dtype=torch.float32, device=device),
        )


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


PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key increments (Weyl sequence)
MASK32 = 0xFFFFFFFF


def _mulhilo32(a: int, b: Tensor) -> tuple[Tensor, Tensor]:
    """(high, low) 32-bit words of a * b for a 32-bit constant a and int64 tensor b in [0, 2^32),
    in 16-bit halves of b so no int64 product overflows."""
    lo_part, hi_part = a * (b & 0xFFFF), a * (b >> 16)  # each < 2^48
    mid = lo_part + ((hi_part & 0xFFFF) << 16)
    return (hi_part >> 16) + (mid >> 32), mid & MASK32


def philox4x32(counter: tuple[Tensor, Tensor, Tensor, Tensor], key: tuple[Tensor, Tensor], rounds: int = 10):
    """Philox4x32 (Salmon et al., SC 2011) on 32-bit words held in int64 tensors; returns 4 words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        hi0, lo0 = _mulhilo32(PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo32(PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
    return c0, c1, c2, c3


def philox_uniforms(seed: Tensor, offset: Tensor, n: int) -> Tensor:
    """Counter-based uniforms in (0, 1], reference (csrc/philox.h and the Triton kernel match it bit for bit).

    Shape: seed [B] int64, offset [B] int64 -> [B, n] fp32. Uniform i of row b is
    ((r >> 8) + 1) * 2^-24 with r the first word of Philox4x32-10 on counter
    (offset_b + i) (low word, high word, 0, 0) and key seed_b (low word, high word).
    """
    counter = offset[:, None] + torch.arange(n, device=offset.device)  # [B, n], wraps like uint64
    seed = seed[:, None].expand_as(counter)
    zero = torch.zeros_like(counter)
    r = philox4x32((counter & MASK32, (counter >> 32) & MASK32, zero, zero), (seed & MASK32, (seed >> 32) & MASK32))[0]
    return ((r >> 8) + 1).float() * 2.0**-24
