"""Batched speculative decoding (``batch_generate``): B requests through both models together,
one cache per model holding every row (:class:`~specdec_fast.models.batched_lm.BatchedLM`), the
rounds of :mod:`specdec_fast.decoding.round`. Finished rows leave the batch, so they cost
nothing afterwards. A request draws its randomness from its own generator, exactly as
``fast_generate`` draws it, so with a fixed draft length its output is ``fast_generate``'s for
the same seed, whatever else is in the batch.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..drafts.binding import batched_pair
from ..drafts.lookup import remember
from ..policies.baselines import FixedDraftLength
from ..policies.mdp import DraftPolicy
from .calibrate import drafting_allowed, loop_costs
from .config import generation_settings
from .outputs import BatchGenerationOutput, GenerationOutput, GenerationStats
from .requests import Request, batch_prompt_ids, check_budget, check_policy, decode_text
from .round import load_kernels, prefill, speculative_round


def batch_generate(
    target,
    draft,
    prompts: Sequence[str] | None = None,
    *,
    input_ids=None,
    messages: Sequence[Sequence[dict]] | None = None,
    tokenizer=None,
    attention_mask=None,
    generation_config=None,
    max_new_tokens: int | Sequence[int] | None = None,
    do_sample: bool | None = None,
    temperature: float | Sequence[float] | None = None,
    top_k: int | Sequence[int] | None = None,
    top_p: float | Sequence[float] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    seeds: Sequence[int] | None = None,
    num_draft_tokens: int = 4,
    policy: DraftPolicy | None = None,
    verifier: str = "token",
    lean: str = "auto",
    guard: bool = True,
    **generate_kwargs,
) -> BatchGenerationOutput:
    """Speculative decoding of a batch of requests; each follows the target's distribution exactly.

    Args:
        target, draft: transformers causal LMs with the same vocabulary, on the same device,
            or the target and a :class:`~specdec_fast.drafts.feature.FeatureDraft` built on it;
            ``draft=None`` is batched autoregressive decoding of the target (the baseline).
        prompts: B raw texts (with ``tokenizer``; no chat template); or ``messages``: B chats (the
            tokenizer's chat template); or ``input_ids``: B token sequences, or a padded [B, S]
            tensor / BatchEncoding with its ``attention_mask`` (padding on either side is dropped).
        generation_config, max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id:
            as for :func:`~specdec_fast.decoding.speculative.fast_generate`; ``max_new_tokens``,
            ``temperature``, ``top_k`` and ``top_p`` may be one value per request.
        seeds: one per request (default: random); request b's output depends on its own
            prompt, settings and seed only (with a fixed draft length).
        num_draft_tokens: draft length of every round, unless ``policy`` chooses it; a
            policy is asked with ``rows`` = the sequences still running (see :mod:`specdec_fast.policies.mdp`).
        verifier, lean, guard: as for :func:`~specdec_fast.decoding.speculative.fast_generate` (the
            guard weighs a round of the batch against a plain round of as many sequences).

    Returns:
        BatchGenerationOutput: per-request outputs (at most ``max_new_tokens`` new tokens each),
        the batch's wall time and draft lengths.
    """
    ids = batch_prompt_ids(input_ids, prompts, tokenizer, messages, attention_mask)
    batch = len(ids)
    settings = generation_settings(target, tokenizer, [len(p) for p in ids], generation_config,
                                   max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                                   top_p=top_p, eos_token_id=eos_token_id, **generate_kwargs)
    sampling, eos = settings.sampling, settings.eos
    policy = policy if policy is not None else FixedDraftLength(num_draft_tokens)
    check_policy(policy, draft)
    if draft is not None:
        draft, guard = loop_costs(target, draft, policy, lean, guard, num_draft_tokens)
    target_lm, draft_lm = batched_pair(target, draft, batch, lean)
    for prompt, budget in zip(ids, settings.max_new_tokens):
        check_budget(prompt, budget, [lm for lm in (target_lm, draft_lm) if lm is not None])
    seeds = list(seeds) if seeds is not None else [torch.seed() for _ in range(batch)]
    if len(seeds) != batch:
        raise ValueError(f"seeds must have one entry per request ({batch}), got {len(seeds)}")
    guard = guard if draft is not None else None

    load_kernels(target_lm)
    start = time.perf_counter()
    requests = [Request(prompt, budget, torch.Generator().manual_seed(int(seed)), GenerationStats(prompt_tokens=len(prompt)))
                for prompt, budget, seed in zip(ids, settings.max_new_tokens, seeds)]
    prefill(target_lm, draft_lm, requests)
    for r in requests:
        r.stats.prefill_s = time.perf_counter() - start
    active = list(range(batch))  # the request of each cache row
    draft_lengths: list[int] = []
    while active:
        running = [requests[b] for b in active]
        longest = max(r.remaining for r in running) - 1
        k = min(policy.begin_round(longest, len(active)), longest) if draft_lm is not None else 0
        k, lookups = drafting_allowed(guard, k, draft, len(active))
        done = speculative_round(target_lm, draft_lm, running, k, sampling.rows(active), verifier, eos, lookups=lookups)
        draft_lengths.append(k)
        still = [b for b, (r, tokens) in enumerate(zip(running, done.committed)) if tokens[-1] not in eos and r.remaining]
        for b in set(range(len(active))) - set(still):
            running[b].stats.wall_s = time.perf_counter() - start
        if len(still) < len(active):  # finished rows leave the batch
            for lm in (target_lm, draft_lm) if draft_lm is not None else (target_lm,):
                lm.select(torch.tensor(still, dtype=torch.int64))
        # The policy is charged the whole round: drafting, then everything after it.
        policy.observe(k, sum(done.verified.accepted) / len(active), done.draft_s, done.target_s, len(active))
        if guard is not None:
            guard.observe(done.drafts.spent, sum(done.drafts.lens), sum(done.verified.accepted), sum(map(len, done.committed)),
                          done.draft_s + done.target_s, len(active))
        active = [active[b] for b in still]

    remember(draft, [r.ids for r in requests])
    outputs = [GenerationOutput(r.new_tokens, decode_text(tokenizer, r.new_tokens), r.stats) for r in requests]
    return BatchGenerationOutput(outputs, time.perf_counter() - start, draft_lengths)
