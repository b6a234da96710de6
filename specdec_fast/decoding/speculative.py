"""Speculative decoding of one sequence (``fast_generate``): the round of
:mod:`specdec_fast.decoding.round` for a batch of one, with the policy asked token by token,
optional first-token alternatives, streaming and a per-round hook."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from ..drafts.binding import cached_pair
from ..drafts.lookup import remember
from ..models.batched_lm import BatchedCachedLM, OneSequence
from ..policies.baselines import FixedDraftLength
from ..policies.mdp import DraftPolicy
from .alternatives import alternatives_round, check_alternatives
from .calibrate import drafting_allowed, loop_costs
from .config import generation_settings
from .outputs import GenerationOutput, GenerationStats
from .requests import Request, check_budget, check_policy, decode_text, prompt_ids
from .round import load_kernels, prefill, speculative_round


def fast_generate(
    target,
    draft,
    input_ids=None,
    *,
    messages: Sequence[dict] | None = None,
    prompt: str | None = None,
    tokenizer=None,
    attention_mask=None,
    generation_config=None,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    num_draft_tokens: int = 4,
    num_alternatives: int = 0,
    policy: DraftPolicy | None = None,
    verifier: str = "token",
    seed: int | None = None,
    streamer=None,
    on_round: Callable | None = None,
    lean: str = "auto",
    guard: bool = True,
    **generate_kwargs,
) -> GenerationOutput:
    """Speculative decoding of one sequence; the output follows the target's distribution exactly.

    Args:
        target, draft: transformers causal LMs or :class:`~specdec_fast.models.cached_lm.CachedLM`
            objects with the same vocabulary, on the same device; or a transformers target and
            a :class:`~specdec_fast.drafts.feature.FeatureDraft` built on it; or any target and a
            :class:`~specdec_fast.drafts.lookup.PromptLookup` (drafts copied from the context).
        input_ids: the prompt, [S] or [1, S], or a dict / BatchEncoding with ``input_ids`` (and
            ``attention_mask``); or ``messages``, a chat in the tokenizer's chat template (the
            assistant's turn opened); or ``prompt``, raw text (no chat template).
        generation_config, max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, and
            ``max_length`` / ``pad_token_id`` among ``generate_kwargs``: transformers' vocabulary
            and rule (a value passed wins, else ``generation_config``'s, else the target's own,
            else greedy with 128 new tokens; see :mod:`specdec_fast.decoding.config`). Greedy
            output equals the target's own greedy decoding. ``eos_token_id=()`` never stops early.
            Anything else the verifier cannot honour is a ValueError naming it.
        num_draft_tokens: draft length per round, unless ``policy`` chooses it.
        num_alternatives: more candidates for each round's first drafted token, verified as
            its siblings in the same target pass (see :mod:`specdec_fast.decoding.alternatives`); an
            accepted one emits two tokens. Needs ``verifier="token"`` and a target with
            ``extend_siblings`` / ``keep_sibling`` (every transformers target has them).
        verifier: "token" (token-wise) or "block" (block verification: the same output
            distribution, never fewer accepted tokens in expectation).
        seed: seeds the generator of all randomness (draft sampling and verification).
        streamer: a transformers streamer (``put``/``end``, e.g. ``TextStreamer``); it gets
            the prompt, then each round's new tokens.
        on_round: called after each verification as ``on_round(target_logits [k+1, V],
            draft_probs [k, V], draft_tokens [k], out: VerifyOutput)`` (traces, monitoring);
            with alternatives, these are the chain's, before an alternative is chosen.
        lean: the target's pass (:mod:`specdec_fast.models.lean`): "auto" (the lean path where the
            model allows, on a CPU; transformers' with ``num_alternatives``), "off", or a weight
            precision "fp32" (read from the checkpoint's 4- / 8-bit blocks where the fp32 weights
            are exactly such blocks: the same numbers), "fp32-dense" (always whole fp32 matrices),
            "bf16", "int8", "q8" (the blocks against 8-bit activations in integers, docs/integer.md;
            the output then follows that model's distribution).
        guard: stop drafting while drafting rounds emit fewer tokens per second than plain rounds
            (autoregressive steps) would, probing again at a falling rate
            (:class:`~specdec_fast.policies.guard.SpeculationGuard`). It and the policy start from
            the costs measured on this machine (:mod:`specdec_fast.decoding.calibrate`: the first
            generation of a pair measures them, under a second, unless ``warmup()`` did). It
            changes how many tokens are drafted, never the output's law.

    Returns:
        GenerationOutput(tokens, text, stats) with at most ``max_new_tokens`` new tokens.
    """
    ids = prompt_ids(input_ids, prompt, tokenizer, messages, attention_mask)
    settings = generation_settings(target, tokenizer, [len(ids)], generation_config, max_new_tokens=max_new_tokens,
                                   do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                   eos_token_id=eos_token_id, **generate_kwargs)
    sampling, eos, max_new_tokens = settings.sampling, settings.eos, settings.max_new_tokens[0]
    lean = "off" if num_alternatives and lean == "auto" else lean
    policy = policy if policy is not None else FixedDraftLength(num_draft_tokens)
    check_policy(policy, draft)
    draft, guard = loop_costs(target, draft, policy, lean, guard, num_draft_tokens)
    target_lm, draft_lm = cached_pair(target, draft, lean)
    check_alternatives(num_alternatives, verifier, target_lm, draft_lm)
    check_budget(ids, max_new_tokens, (target_lm, draft_lm))
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())
    load_kernels(target_lm)

    start = time.perf_counter()
    seq = Request(ids, max_new_tokens, generator, GenerationStats(prompt_tokens=len(ids)))
    target_lm.reset()
    draft_lm.reset()
    one_target = OneSequence(target_lm)
    one_draft = draft_lm if isinstance(draft_lm, BatchedCachedLM) else OneSequence(draft_lm)  # a lookup draft is one already
    prefill(one_target, one_draft, [seq])
    seq.stats.prefill_s = time.perf_counter() - start
    if streamer is not None:
        streamer.put(torch.tensor(ids))

    while seq.remaining > 0:
        k = min(policy.begin_round(seq.remaining - 1), seq.remaining - 1)
        k, lookups = drafting_allowed(guard, k, draft)
        if num_alternatives:
            r = alternatives_round(one_target, one_draft, seq, k, num_alternatives, sampling, eos, policy)
        else:
            r = speculative_round(one_target, one_draft, [seq], k, sampling, verifier, eos, policy, lookups)
        drafts, verified, emitted = r.drafts, r.verified, r.committed[0]
        policy.observe(drafts.lens[0], verified.accepted[0], r.draft_s, r.target_s)
        if guard is not None:
            guard.observe(drafts.spent, drafts.lens[0], verified.accepted[0], len(emitted), r.draft_s + r.target_s)
        if on_round is not None:
            on_round(verified.target_logits[0], drafts.dense_probs(verified.target_logits.shape[-1])[0], drafts.tokens[0],
                     verified.out)
        if streamer is not None:
            streamer.put(torch.tensor(emitted))
        if emitted[-1] in eos:
            break

    seq.stats.wall_s = time.perf_counter() - start
    remember(draft, [seq.ids])
    if streamer is not None:
        streamer.end()
    return GenerationOutput(seq.new_tokens, decode_text(tokenizer, seq.new_tokens), seq.stats)
