"""``warmup()``: every part of the loop run once before the first request."""

from __future__ import annotations

import time

import torch

from ..models.lean import cached_lm
from .autoregressive import generate_autoregressive
from .speculative import fast_generate


def warmup(target, draft=None, *, num_draft_tokens: int = 4, num_alternatives: int = 0, max_new_tokens: int = 8,
           lean: str = "auto") -> float:
    """Load the verification kernels and run every part of the loop once, so that the first
    user request is not the slow one; returns the seconds it took.

    One short sampled and one greedy generation on a dummy prompt: prefill, draft passes
    and draft steps, a multi-token target pass, verification and cache rollback (with
    ``draft=None``, the target alone). ``target``, ``draft``, ``num_alternatives`` and ``lean`` are as
    for :func:`fast_generate`; the lean path's cost (its kernel build, the stacking of the weights, or
    their bf16 / int8 copies) is paid here.
    """
    start = time.perf_counter()
    prompt = torch.arange(1, 9) % cached_lm(target, lean).vocab_size
    for temperature in (1.0, 0.0):
        if draft is None:
            generate_autoregressive(target, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=0,
                                    eos_token_id=(), lean=lean)
        else:
            fast_generate(target, draft, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                          num_draft_tokens=num_draft_tokens, num_alternatives=num_alternatives, seed=0, eos_token_id=(),
                          lean=lean)
    return time.perf_counter() - start
