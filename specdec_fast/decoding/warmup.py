"""``warmup()``: every part of the loop run once before the first request."""

from __future__ import annotations

import time

import torch

from ..models.cached_lm import as_cached_lm
from .autoregressive import generate_autoregressive
from .speculative import fast_generate


def warmup(target, draft=None, *, num_draft_tokens: int = 4, num_alternatives: int = 0, max_new_tokens: int = 8) -> float:
    """Load the verification kernels and run every part of the loop once, so that the first
    user request is not the slow one; returns the seconds it took.

    One short sampled and one greedy generation on a dummy prompt: prefill, draft passes
    and draft steps, a multi-token target pass, verification and cache rollback (with
    ``draft=None``, the target alone). ``target``, ``draft`` and ``num_alternatives`` are as for
    :func:`fast_generate`.
    """
    start = time.perf_counter()
    prompt = torch.arange(1, 9) % as_cached_lm(target).vocab_size
    for temperature in (1.0, 0.0):
        if draft is None:
            generate_autoregressive(target, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=0,
                                    eos_token_id=())
        else:
            fast_generate(target, draft, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                          num_draft_tokens=num_draft_tokens, num_alternatives=num_alternatives, seed=0, eos_token_id=())
    return time.perf_counter() - start
