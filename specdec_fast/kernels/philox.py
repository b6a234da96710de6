"""Counter-based uniforms, reference: Philox4x32-10 (Salmon et al., SC 2011) in pure torch.

csrc/philox.h and the Triton kernel match it bit for bit; it is checked against Random123's
known-answer vectors. A request's uniform i is a function of (seed, offset + i) alone, so
no other request in a batch affects it.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
