"""The baseline: autoregressive decoding of one sequence, one KV-cached target pass per token."""

from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import Tensor

from ..kernels import SamplingParams, draft_step
from ..kernels.sampling import draw_uniforms
from ..models.cached_lm import as_cached_lm
from .outputs import GenerationOutput, GenerationStats
from .requests import check_budget, decode_text, eos_ids, prompt_ids


def generate_autoregressive(
    model,
    input_ids: Tensor | Sequence[int] | None = None,
    *,
    prompt: str | None = None,
    tokenizer=None,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    streamer=None,
) -> GenerationOutput:
    """The baseline: one KV-cached target pass per token, sampled exactly as ``fast_generate`` samples.

    Same arguments and return type as :func:`fast_generate`, without the draft.
    """
    lm = as_cached_lm(model)
    sampling = SamplingParams(temperature, top_k, top_p)
    eos = eos_ids(eos_token_id, model, tokenizer)
    ids = prompt_ids(input_ids, prompt, tokenizer)
    check_budget(ids, max_new_tokens, (lm,))
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())

    start = time.perf_counter()
    stats = GenerationStats(prompt_tokens=len(ids))
    lm.reset()
    logits = lm.extend(torch.tensor(ids), 1)[-1]
    stats.target_calls += 1
    stats.prefill_s = time.perf_counter() - start
    if streamer is not None:
        streamer.put(torch.tensor(ids))
    new: list[int] = []
    while True:
        u = draw_uniforms(1, 1, generator)[:, 0]
        step = draft_step(logits[None], sampling=sampling, uniforms=u)
        token = int(step.tokens)
        new.append(token)
        if streamer is not None:
            streamer.put(step.tokens)
        stats.rounds += 1
        stats.new_tokens += 1
        if len(new) == max_new_tokens or token in eos:
            break
        target_start = time.perf_counter()
        logits = lm.extend(step.tokens, 1)[-1]
        stats.target_s += time.perf_counter() - target_start
        stats.target_calls += 1
    stats.wall_s = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    return GenerationOutput(new, decode_text(tokenizer, new), stats)
