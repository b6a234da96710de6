"""The decoding loops: speculative (``fast_generate``) and its autoregressive baseline.

Both keep a real KV cache per model. Invariant of the speculative loop: before a round,
with n committed tokens, the target's cache holds the first n - 1 of them; the round
feeds [last committed token, X_1..X_k] to the target in one pass, verifies, and crops
both caches back to the longest prefix that is still valid.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from .alternatives import draw_alternatives, verify_alternatives
from .cached_lm import CachedLM, as_cached_lm
from .ops import draft_step, verify
from .policy import DraftPolicy, FixedDraftLength
from .sampling import SamplingParams, draw_uniforms, warp_logits


@dataclass
class GenerationStats:
    """Counters of one generation. Rates are derived properties.

    target_calls and draft_calls count forward passes (prefill included); a round is one
    draft phase plus one verification pass of the target.
    """

    prompt_tokens: int
    new_tokens: int = 0
    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    withheld: int = 0  # rounds whose first drafted token the policy chose not to verify (a draft pass spent)
    alternatives: int = 0  # first-token alternatives verified (not counted in drafted)
    alternatives_accepted: int = 0  # rounds whose first token was an alternative (not counted in accepted)
    drafted_at: list[int] = field(default_factory=list)  # per draft position: rounds that drafted it
    accepted_at: list[int] = field(default_factory=list)  # per draft position: rounds that accepted it
    prefill_s: float = 0.0
    draft_s: float = 0.0  # draft passes and draft steps
    target_s: float = 0.0  # target verification passes
    verify_s: float = 0.0  # the verify op
    wall_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 if nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification pass of the target (prefill excluded)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft position i accepted | position i drafted), i = 0..max drafted - 1."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def target_pass_s(self) -> float:
        """Mean seconds of one target pass after the prefill (target_s over those passes)."""
        return self.target_s / (self.target_calls - 1) if self.target_calls > 1 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens / wall time (prefill included)."""
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    def record_round(self, drafted: int, accepted: int, emitted: int) -> None:
        self.rounds += 1
        self.target_calls += 1
        self.drafted += drafted
        self.accepted += accepted
        self.new_tokens += emitted
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    def as_dict(self) -> dict:
        d = asdict(self)
        for name in ("acceptance_rate", "mean_accepted_length", "per_position_acceptance", "tokens_per_second"):
            d[name] = getattr(self, name)
        return d

    def summary(self) -> str:
        pos = " ".join(f"{a:.2f}" for a in self.per_position_acceptance)
        alternatives = f"alternatives accepted {self.alternatives_accepted}/{self.alternatives} | " if self.alternatives else ""
        return (
            f"{self.new_tokens} tokens in {self.wall_s:.2f} s ({self.tokens_per_second:.1f} tok/s) | "
            f"rounds {self.rounds}, target calls {self.target_calls}, draft calls {self.draft_calls}, "
            f"first drafts withheld {self.withheld} | "
            f"acceptance {self.acceptance_rate:.3f} ({self.accepted}/{self.drafted}), "
            f"mean accepted length {self.mean_accepted_length:.2f} | per position [{pos}] | {alternatives}"
            f"time: draft {self.draft_s:.2f} s, target {self.target_s:.2f} s, verify {self.verify_s:.3f} s"
        )


@dataclass
class GenerationOutput:
    """tokens: the new tokens (prompt excluded); text: their decoding if a tokenizer was given."""

    tokens: list[int]
    text: str | None
    stats: GenerationStats


def prompt_ids(input_ids: Tensor | Sequence[int] | None, prompt: str | None, tokenizer) -> Tensor:
    """The prompt as an int64 tensor [S] from ``input_ids`` ([S] or [1, S]) or ``prompt`` + ``tokenizer``."""
    if (input_ids is None) == (prompt is None):
        raise ValueError("pass exactly one of input_ids or prompt")
    if prompt is not None:
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        input_ids = tokenizer(prompt).input_ids
    ids = torch.as_tensor(input_ids, dtype=torch.int64)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"input_ids must have shape [S] or [1, S], got {list(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("empty prompt: at least one token is needed to condition on")
    return ids


def eos_ids(eos_token_id: int | Sequence[int] | None, model, tokenizer) -> set[int]:
    """End-of-sequence ids: ``eos_token_id`` if given (``()`` disables stopping), else the
    model's generation config, else the tokenizer's."""
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}


def _check_budget(ids: Tensor, max_new_tokens: int, lms: Sequence[CachedLM]) -> None:
    if int(max_new_tokens) != max_new_tokens or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
    for lm in lms:
        if ids.max() >= lm.vocab_size or ids.min() < 0:
            raise ValueError(f"prompt has token ids outside [0, {lm.vocab_size})")
        if lm.max_length is not None and len(ids) + max_new_tokens > lm.max_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's context of {lm.max_length} tokens"
            )


def check_pair(target_lm, draft_lm) -> None:
    """Target and draft must share the vocabulary and (where they say) the device."""
    if target_lm.vocab_size != draft_lm.vocab_size:
        raise ValueError(f"vocabulary mismatch: target has {target_lm.vocab_size} logits, draft has {draft_lm.vocab_size}")
    devices = getattr(target_lm, "device", None), getattr(draft_lm, "device", None)
    if None not in devices and devices[0] != devices[1]:
        raise ValueError(f"device mismatch: target is on {devices[0]}, draft on {devices[1]}")


def cached_pair(target, draft) -> tuple[CachedLM, CachedLM]:
    """The (target, draft) caches of one sequence: each model as :func:`as_cached_lm` makes it,
    or, for a :class:`~specdec_fast.feature_draft.FeatureDraft` draft, the bound pair of
    :func:`~specdec_fast.feature_draft.feature_pair`."""
    from .feature_draft import FeatureDraft, feature_pair  # feature_draft imports batch, which imports this module

    if isinstance(draft, FeatureDraft):
        return feature_pair(target, draft)
    return as_cached_lm(target), as_cached_lm(draft)


def _catch_up(lm: CachedLM, ids: Tensor, n: int) -> Tensor:
    """Feed the committed tokens ids[cache_length:n] (at least one) and return the next-token logits [V]."""
    return lm.extend(ids[lm.cache_length : n], 1)[-1]


def _decode(tokenizer, tokens: list[int]) -> str | None:
    return tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None


def _first_eos(tokens: list[int], eos: set[int]) -> int:
    """Number of tokens to keep: up to and including the first EOS."""
    for i, t in enumerate(tokens):
        if t in eos:
            return i + 1
    return len(tokens)


def fast_generate(
    target,
    draft,
    input_ids: Tensor | Sequence[int] | None = None,
    *,
    prompt: str | None = None,
    tokenizer=None,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    num_draft_tokens: int = 4,
    num_alternatives: int = 0,
    policy: DraftPolicy | None = None,
    verifier: str = "token",
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    streamer=None,
    on_round: Callable | None = None,
) -> GenerationOutput:
    """Speculative decoding of one sequence; the output follows the target's distribution exactly.

    Args:
        target, draft: transformers causal LMs or :class:`~specdec_fast.cached_lm.CachedLM`
            objects with the same vocabulary, on the same device; or a transformers target and
            a :class:`~specdec_fast.feature_draft.FeatureDraft` built on it.
        input_ids: the prompt, [S] or [1, S]; or ``prompt`` text with its ``tokenizer``.
        temperature, top_k, top_p: sampling; temperature 0 is greedy (then the output equals
            the target's own greedy decoding).
        num_draft_tokens: draft length per round, unless ``policy`` chooses it.
        num_alternatives: more candidates for each round's first drafted token, verified as
            its siblings in the same target pass (see :mod:`specdec_fast.alternatives`); an
            accepted one emits two tokens. Needs ``verifier="token"`` and a target with
            ``extend_siblings`` / ``keep_sibling`` (every transformers target has them).
        verifier: "token" (token-wise) or "block" (block verification: the same output
            distribution, never fewer accepted tokens in expectation).
        seed: seeds the generator of all randomness (draft sampling and verification).
        eos_token_id: stop after this token (int or several); None takes the target's
            generation config or the tokenizer's; ``()`` never stops early.
        streamer: a transformers streamer (``put``/``end``, e.g. ``TextStreamer``); it gets
            the prompt, then each round's new tokens.
        on_round: called after each verification as ``on_round(target_logits [k+1, V],
            draft_probs [k, V], draft_tokens [k], out: VerifyOutput)`` (traces, monitoring);
            with alternatives, these are the chain's, before an alternative is chosen.

    Returns:
        GenerationOutput(tokens, text, stats) with at most ``max_new_tokens`` new tokens.
    """
    target_lm, draft_lm = cached_pair(target, draft)
    check_pair(target_lm, draft_lm)
    params = SamplingParams(temperature, top_k, top_p)
    _check_alternatives(num_alternatives, verifier, target_lm)
    policy = policy if policy is not None else FixedDraftLength(num_draft_tokens)
    eos = eos_ids(eos_token_id, target, tokenizer)
    prompt_tensor = prompt_ids(input_ids, prompt, tokenizer)
    _check_budget(prompt_tensor, max_new_tokens, (target_lm, draft_lm))
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())
    sampling = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)

    start = time.perf_counter()
    prompt_len = len(prompt_tensor)
    ids = torch.zeros(prompt_len + max_new_tokens, dtype=torch.int64)  # committed tokens
    ids[:prompt_len] = prompt_tensor
    n = prompt_len
    stats = GenerationStats(prompt_tokens=prompt_len)
    target_lm.reset()
    draft_lm.reset()
    if prompt_len > 1:  # both caches hold all committed tokens but the last (the target's first:
        target_lm.extend(ids[: n - 1], 1)  # a feature draft reads its features), so the first
        draft_lm.extend(ids[: n - 1], 1)  # round costs what later rounds cost
        stats.target_calls += 1
        stats.draft_calls += 1
    stats.prefill_s = time.perf_counter() - start
    if streamer is not None:
        streamer.put(prompt_tensor)

    while n < prompt_len + max_new_tokens:
        remaining = prompt_len + max_new_tokens - n
        k_max = min(policy.begin_round(remaining - 1), remaining - 1)
        u_draft = draw_uniforms(1, k_max, generator)
        u_verify = draw_uniforms(1, k_max + 1, generator)

        # Draft: X_i ~ q_i, one draft pass per token (the first pass also catches up on
        # committed tokens the draft has not seen).
        draft_start = time.perf_counter()
        tokens, probs, alternatives = [], [], torch.zeros(0, dtype=torch.int64)
        if k_max > 0:
            logits = _catch_up(draft_lm, ids, n)
            stats.draft_calls += 1
            for i in range(k_max):
                step = draft_step(logits[None], **sampling, uniforms=u_draft[:, i])
                if i == 0 and not policy.propose_first(step, params.temperature):
                    stats.withheld += 1
                    break
                if i == 0 and num_alternatives:
                    alternatives = draw_alternatives(logits, step.probs[0], int(step.tokens), num_alternatives,
                                                     params.temperature, generator)
                tokens.append(step.tokens)
                probs.append(step.probs)
                if i + 1 == k_max or int(step.tokens) in eos or not policy.continue_drafting(i, step, params.temperature):
                    break
                logits = draft_lm.extend(step.tokens, 1)[-1]
                stats.draft_calls += 1
        k = len(tokens)
        target_start = time.perf_counter()
        stats.draft_s += target_start - draft_start

        # Verify: one target pass over [last committed, X_1..X_k] gives p_1..p_{k+1}
        # (and, after them, the rows of X_1's alternatives).
        draft_tokens = torch.cat(tokens) if k else torch.zeros(0, dtype=torch.int64)
        pending = ids[target_lm.cache_length : n].to(draft_tokens.device)  # committed ids stay on the host
        chain, a = torch.cat([pending, draft_tokens]), len(alternatives)
        if a:
            target_logits = target_lm.extend_siblings(chain, alternatives, len(pending), k + 1)
            target_logits, sibling_logits = target_logits[: k + 1], target_logits[k + 1 :]
        else:
            target_logits = target_lm.extend(chain, k + 1)
        vocab = target_logits.shape[-1]
        q = torch.stack(probs, dim=1) if k else torch.zeros(1, 0, vocab)
        verify_start = time.perf_counter()
        stats.target_s += verify_start - target_start
        out = verify(
            target_logits[None], q.to(target_logits.device), draft_tokens[None].to(target_logits.device),
            **sampling, uniforms=u_verify[:, : k + 1], verifier=verifier,
        )
        accepted = int(out.num_accepted)
        emitted = out.tokens[0, : accepted + 1].tolist()  # the round's one host sync
        sibling = -1
        if accepted == 0 and a:
            sibling, emitted = _try_alternatives(target_logits[0], sibling_logits, q[0, 0], int(draft_tokens[0]),
                                                 alternatives, params, generator)
        emitted = emitted[: _first_eos(emitted, eos)]
        round_end = time.perf_counter()
        stats.verify_s += round_end - verify_start
        if on_round is not None:
            on_round(target_logits, q[0], draft_tokens, out)

        # Roll back: both caches keep only the prefix shared with the new committed sequence
        # (the target's ends with the accepted alternative, moved into place).
        if sibling >= 0:
            target_lm.keep_sibling(n + 1, target_lm.cache_length - a + sibling)
        for lm in (target_lm, draft_lm) if sibling < 0 else (draft_lm,):
            lm.crop(min(lm.cache_length, n + accepted))
        ids[n : n + len(emitted)] = torch.tensor(emitted)
        n += len(emitted)
        stats.record_round(k, accepted, len(emitted))
        stats.alternatives += a
        stats.alternatives_accepted += sibling >= 0
        policy.observe(k, accepted, target_start - draft_start, round_end - target_start)
        if streamer is not None:
            streamer.put(torch.tensor(emitted))
        if emitted[-1] in eos:
            break

    stats.wall_s = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    new = ids[prompt_len:n].tolist()
    return GenerationOutput(new, _decode(tokenizer, new), stats)


def _check_alternatives(num_alternatives: int, verifier: str, target_lm: CachedLM) -> None:
    if int(num_alternatives) != num_alternatives or num_alternatives < 0:
        raise ValueError(f"num_alternatives must be a non-negative integer, got {num_alternatives}")
    if num_alternatives and verifier != "token":
        raise ValueError(f"first-token alternatives need verifier='token', got {verifier!r}")
    if num_alternatives and not hasattr(target_lm, "extend_siblings"):
        raise ValueError(f"first-token alternatives need a target with extend_siblings and keep_sibling; "
                         f"{type(target_lm).__name__} has neither")


def _try_alternatives(p_logits: Tensor, sibling_logits: Tensor, q: Tensor, first: int, alternatives: Tensor,
                      params: SamplingParams, generator: torch.Generator) -> tuple[int, list[int]]:
    """After X_1 = ``first`` was rejected: (accepted alternative or -1, the round's emitted tokens),
    the alternative and the target's token after it, or one token from the residual."""
    a, greedy = len(alternatives), params.temperature == 0
    u = draw_uniforms(1, a + 2, generator)[0]
    p = p_logits if greedy else warp_logits(p_logits[None], *params.as_tensors(1, p_logits.device))[0]
    sibling, token = verify_alternatives(p, q.to(p.device), first, alternatives, u[: a + 1], greedy)
    if sibling < 0:
        return sibling, [token]
    bonus = draft_step(sibling_logits[sibling][None], **asdict(params), uniforms=u[a + 1 :])
    return sibling, [token, int(bonus.tokens)]


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
    params = SamplingParams(temperature, top_k, top_p)
    eos = eos_ids(eos_token_id, model, tokenizer)
    ids = prompt_ids(input_ids, prompt, tokenizer)
    _check_budget(ids, max_new_tokens, (lm,))
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed())

    start = time.perf_counter()
    stats = GenerationStats(prompt_tokens=len(ids))
    lm.reset()
    logits = lm.extend(ids, 1)[-1]
    stats.target_calls += 1
    stats.prefill_s = time.perf_counter() - start
    if streamer is not None:
        streamer.put(ids)
    new: list[int] = []
    while True:
        u = draw_uniforms(1, 1, generator)[:, 0]
        step = draft_step(logits[None], temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, uniforms=u)
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
    return GenerationOutput(new, _decode(tokenizer, new), stats)


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
