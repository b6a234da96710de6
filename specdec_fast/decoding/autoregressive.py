"""The baseline: autoregressive decoding of one sequence, one KV-cached target pass per token."""

from __future__ import annotations

import time

import torch

from ..kernels import draft_step
from ..kernels.sampling import draw_uniforms
from ..models.lean import cached_lm
from .config import generation_settings
from .outputs import GenerationOutput, GenerationStats
from .requests import check_budget, decode_text, prompt_ids
from .round import load_kernels


def generate_autoregressive(
    model,
    input_ids=None,
    *,
    tokenizer=None,
    seed: int | None = None,
    streamer=None,
    lean: str = "auto",
    **generation,
) -> GenerationOutput:
    """The baseline: one KV-cached target pass per token, sampled exactly as ``fast_generate`` samples.

    The prompt (``input_ids``, ``messages`` or ``prompt``, ``attention_mask``) and the generation
    settings (``generation_config``, ``max_new_tokens``, ``do_sample``, ``temperature``, ...) are
    those of :func:`~specdec_fast.decoding.speculative.fast_generate`; so are ``lean`` and the return type.
    """
    prompt = {name: generation.pop(name, None) for name in ("messages", "prompt", "attention_mask")}
    ids = prompt_ids(input_ids, tokenizer=tokenizer, **prompt)
    settings = generation_settings(model, tokenizer, [len(ids)], **generation)
    sampling, eos, max_new_tokens = settings.sampling, settings.eos, settings.max_new_tokens[0]
    lm = cached_lm(model, lean)
    check_budget(ids, max_new_tokens, (lm,))
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())
    load_kernels(lm)

    start = time.perf_counter()
    stats = GenerationStats(prompt_tokens=len(ids))
    lm.reset()
    if len(ids) > 1:  # the prompt but its last token first, as every loop fills a cache (round.prefill)
        lm.extend(torch.tensor(ids[:-1]), 1)
        stats.target_calls += 1
    logits = lm.extend(torch.tensor(ids[-1:]), 1)[-1]
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
