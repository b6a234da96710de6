"""Batched speculative decoding: B sequences through both models together (``batch_generate``).

One transformers KV cache per model holds every row. Each slot (cache position) of row b
is either valid (a token of b's sequence) or a hole: left padding, the filler of a row that
fed fewer tokens than the others, or a rejected draft token. Holes are masked out of
attention and skipped by the position ids, so each row's logits are those of its own
sequence. Rolling back by a different amount per row turns slots into holes; slots that no
row uses any more are cropped off the end. Finished rows leave the batch (their cache rows
are dropped), so they cost nothing afterwards.

Invariants as in ``fast_generate``, per row: the target's cache holds the row's committed
tokens but the last; the draft's cache a prefix of them. A request draws its randomness
from its own generator, exactly as ``fast_generate`` draws it, so with a fixed draft length
a request's output does not depend on the rest of the batch: it is ``fast_generate``'s
output for the same seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .cached_lm import TransformersLM, is_transformers_lm
from .generate import (GenerationOutput, GenerationStats, _check_budget, _decode, _first_eos, check_pair, eos_ids,
                       prompt_ids)
from .ops import _sampling_tensors, draft_step, verify
from .policy import DraftPolicy, FixedDraftLength
from .sampling import draw_uniforms


class BatchedLM(TransformersLM):
    """A transformers causal LM with one ``DynamicCache`` for B sequences of different lengths.

    ``valid`` [B, slots] bool marks the slots that hold a token of the row's sequence.
    """

    def __init__(self, model: torch.nn.Module, batch: int):
        from transformers import DynamicCache

        if not is_transformers_lm(model):
            raise TypeError(f"{type(model).__name__} is not a transformers causal LM (batch_generate needs one)")
        super().__init__(model)
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)

    @property
    def lengths(self) -> Tensor:
        """[B] int64: tokens of each row in the cache."""
        return self.valid.sum(1)

    @torch.inference_mode()
    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        """Append one slot per column: ``tokens`` [B, n] int64, ``fed`` [B, n] bool (False: a hole).

        Returns the logits [B, num_logits, V] of the last ``num_logits`` slots.
        """
        inputs = self._append(fed)
        return self.model(input_ids=tokens.to(self.device), logits_to_keep=num_logits, **inputs).logits

    def _positions(self, fed: Tensor) -> Tensor:
        """[B, n] int64: the sequence positions of the slots one ``extend`` would add (``fed`` [B, n] bool, on the device)."""
        return (self.lengths[:, None] + fed.cumsum(1) - 1).clamp(min=0)

    def _append(self, fed: Tensor) -> dict:
        """Add the slots of one ``extend`` (``fed`` [B, n] bool) and return the model's keyword
        arguments for them: the mask over all slots, the new slots' position ids [B, n], the cache."""
        fed = fed.to(self.device)
        positions = self._positions(fed)
        self.valid = torch.cat([self.valid, fed], 1)
        return dict(attention_mask=self.valid.long(), position_ids=positions, use_cache=True, **{self._cache_arg: self.cache})

    def keep(self, lengths: Tensor) -> None:
        """Keep the first ``lengths[b]`` tokens of row b ([B] int64); drop the slots no row uses."""
        self.valid = self.valid & (self.valid.cumsum(1) <= lengths.to(self.device)[:, None])
        used = self.valid.any(0).nonzero()
        end = int(used[-1]) + 1 if len(used) else 0
        if end < self.valid.shape[1]:
            self.cache.crop(end - self.valid.shape[1])
            self.valid = self.valid[:, :end]

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` ([B'] int64 indices) of the batch."""
        self.cache.batch_select_indices(rows.to(self.device))
        self.valid = self.valid[rows.to(self.device)]


def batched_pair(target: torch.nn.Module, draft: torch.nn.Module | None, batch: int) -> tuple[BatchedLM, BatchedLM | None]:
    """The batch caches of ``target`` and ``draft`` (a transformers causal LM, a
    :class:`~specdec_fast.feature_draft.FeatureDraft` of this target, or None)."""
    from .feature_draft import BatchedFeatureDraft, BatchedFeatureTarget, FeatureDraft  # it imports this module

    if isinstance(draft, FeatureDraft):
        target_lm = BatchedFeatureTarget(target, batch)
        return target_lm, BatchedFeatureDraft(draft, target_lm, batch)
    return BatchedLM(target, batch), BatchedLM(draft, batch) if draft is not None else None


def right_aligned(seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Rows of different lengths as tokens [B, width] int64 and fed [B, width] bool, holes on the left."""
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.int64)
    fed = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            tokens[b, width - len(s):] = torch.tensor(s)
            fed[b, width - len(s):] = True
    return tokens, fed


def _padded(rows: list[Tensor], width: int) -> Tensor:
    """[1, n_b] uniforms per row -> [B, width], padded with 1 (a valid, unused uniform)."""
    out = torch.ones(len(rows), width)
    for b, u in enumerate(rows):
        out[b, : u.shape[1]] = u[0]
    return out


def _draft(draft_lm: BatchedLM, sequences: list[list[int]], k: int, lens: list[int], uniforms: Tensor,
           sampling: dict, eos: set[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Draft k tokens for every row: tokens [B] and probs [B, V] per position. The first pass
    catches each row up on the committed tokens its draft has not seen; a row whose draft
    reaches EOS stops there (``lens`` is shortened in place), as in ``fast_generate``."""
    seen = draft_lm.lengths.tolist()
    logits = draft_lm.extend(*right_aligned([seq[m:] for seq, m in zip(sequences, seen)]), 1)[:, -1]
    tokens, probs = [], []
    for i in range(k):
        step = draft_step(logits, **sampling, uniforms=uniforms[:, i])
        tokens.append(step.tokens)
        probs.append(step.probs)
        for b, token in enumerate(step.tokens.tolist()):
            if token in eos and i < lens[b]:
                lens[b] = i + 1
        if i + 1 < k:
            logits = draft_lm.extend(step.tokens[:, None], torch.ones(len(sequences), 1, dtype=torch.bool), 1)[:, -1]
    return tokens, probs


@dataclass
class BatchGenerationOutput:
    """outputs: one GenerationOutput per request, in request order (stats count the rounds the
    request took part in; its wall_s ends when it finished); wall_s: the whole batch, prefill
    included; draft_lengths: the draft length of each round."""

    outputs: list[GenerationOutput]
    wall_s: float
    draft_lengths: list[int]

    @property
    def new_tokens(self) -> int:
        return sum(o.stats.new_tokens for o in self.outputs)

    @property
    def tokens_per_second(self) -> float:
        """New tokens of all requests / wall time."""
        return self.new_tokens / self.wall_s if self.wall_s else 0.0


def _requests(prompts, input_ids, tokenizer) -> list[Tensor]:
    if (prompts is None) == (input_ids is None):
        raise ValueError("pass exactly one of prompts or input_ids")
    if prompts is not None:
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list of strings (one per request), got a single string")
        requests = [prompt_ids(None, p, tokenizer) for p in prompts]
    else:
        requests = [prompt_ids(ids, None, None) for ids in input_ids]
    if not requests:
        raise ValueError("empty batch: pass at least one prompt")
    return requests


def batch_generate(
    target,
    draft,
    prompts: Sequence[str] | None = None,
    *,
    input_ids: Sequence[Tensor | Sequence[int]] | None = None,
    tokenizer=None,
    max_new_tokens: int = 128,
    temperature: float | Sequence[float] = 1.0,
    top_k: int | Sequence[int] = 0,
    top_p: float | Sequence[float] = 1.0,
    seeds: Sequence[int] | None = None,
    num_draft_tokens: int = 4,
    policy: DraftPolicy | None = None,
    verifier: str = "token",
    eos_token_id: int | Sequence[int] | None = None,
) -> BatchGenerationOutput:
    """Speculative decoding of a batch of requests; each follows the target's distribution exactly.

    Args:
        target, draft: transformers causal LMs with the same vocabulary, on the same device,
            or the target and a :class:`~specdec_fast.feature_draft.FeatureDraft` built on it;
            ``draft=None`` is batched autoregressive decoding of the target (the baseline).
        prompts: B text prompts (with ``tokenizer``), or ``input_ids``: B token sequences.
        temperature, top_k, top_p: one value for all requests or one per request.
        seeds: one per request (default: random); request b's output depends on its own
            prompt, settings and seed only (with a fixed draft length).
        num_draft_tokens: draft length of every round, unless ``policy`` chooses it; a
            policy is asked with ``rows`` = the sequences still running (see policy.py).
        verifier, eos_token_id: as for :func:`~specdec_fast.generate.fast_generate`.

    Returns:
        BatchGenerationOutput: per-request outputs (at most ``max_new_tokens`` new tokens each),
        the batch's wall time and draft lengths.
    """
    requests = _requests(prompts, input_ids, tokenizer)
    batch = len(requests)
    target_lm, draft_lm = batched_pair(target, draft, batch)
    if draft_lm is not None:
        check_pair(target_lm, draft_lm)
    for ids in requests:
        _check_budget(ids, max_new_tokens, [lm for lm in (target_lm, draft_lm) if lm is not None])
    seeds = list(seeds) if seeds is not None else [torch.seed() for _ in range(batch)]
    if len(seeds) != batch:
        raise ValueError(f"seeds must have one entry per request ({batch}), got {len(seeds)}")
    device = target_lm.device
    settings = _sampling_tensors(temperature, top_k, top_p, batch, device)  # each [B], checked
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    policy = policy if policy is not None else FixedDraftLength(num_draft_tokens)
    eos = eos_ids(eos_token_id, target, tokenizer)

    start = time.perf_counter()
    committed = [ids.tolist() for ids in requests]
    stats = [GenerationStats(prompt_tokens=len(ids)) for ids in committed]
    active = list(range(batch))  # request of each cache row
    if max(len(ids) for ids in committed) > 1:  # both caches hold all committed tokens but the last
        for lm in (target_lm, draft_lm):
            if lm is not None:
                lm.extend(*right_aligned([ids[:-1] for ids in committed]), 1)
        for s in stats:
            s.target_calls += 1
            s.draft_calls += draft_lm is not None
    for s in stats:
        s.prefill_s = time.perf_counter() - start
    draft_lengths: list[int] = []

    while active:
        round_start = time.perf_counter()
        rows = torch.tensor(active)
        sampling = {name: t[rows.to(device)] for name, t in zip(("temperature", "top_k", "top_p"), settings)}
        remaining = [max_new_tokens - stats[r].new_tokens for r in active]
        k = min(policy.begin_round(max(remaining) - 1, len(active)), max(remaining) - 1) if draft_lm is not None else 0
        lens = [min(k, left - 1) for left in remaining]
        u_draft = [draw_uniforms(1, n, generators[r]) for r, n in zip(active, lens)]
        u_verify = [draw_uniforms(1, n + 1, generators[r]) for r, n in zip(active, lens)]

        tokens, probs = [], []
        if k:
            tokens, probs = _draft(draft_lm, [committed[r] for r in active], k, lens, _padded(u_draft, k), sampling, eos)
        target_start = time.perf_counter()

        # Verify: one target pass over [last committed, X_1..X_k] for every row.
        last = torch.tensor([[committed[r][-1]] for r in active])
        draft_tokens = torch.stack(tokens, 1) if k else torch.zeros(len(active), 0, dtype=torch.int64)
        feed = torch.cat([last, draft_tokens.cpu()], 1)
        target_logits = target_lm.extend(feed, torch.ones_like(feed, dtype=torch.bool), k + 1)
        verify_start = time.perf_counter()
        q = torch.stack(probs, 1) if k else torch.zeros(len(active), 0, target_logits.shape[-1], device=device)
        uniforms = _padded([u[:, :n] for u, n in zip(u_verify, lens)], k + 1)
        uniforms[:, k] = torch.stack([u[0, n] for u, n in zip(u_verify, lens)])  # the emitted token's sample
        out = verify(target_logits, q, draft_tokens.to(device), torch.tensor(lens, device=device), **sampling,
                     uniforms=uniforms, verifier=verifier)
        accepted = out.num_accepted.tolist()
        out_tokens = out.tokens.tolist()  # the round's one host sync
        verify_end = time.perf_counter()

        # Commit, roll back per row, and let finished rows leave.
        draft_lengths.append(k)
        lengths = torch.tensor([len(committed[r]) + a for r, a in zip(active, accepted)])
        target_lm.keep(lengths)
        if draft_lm is not None:
            draft_lm.keep(torch.minimum(draft_lm.lengths.cpu(), lengths))
        still = []
        for b, r in enumerate(active):
            emitted = out_tokens[b][: accepted[b] + 1]
            emitted = emitted[: _first_eos(emitted, eos)]
            committed[r] += emitted
            s = stats[r]
            s.record_round(lens[b], accepted[b], len(emitted))
            s.draft_calls += k
            s.draft_s += target_start - round_start
            s.target_s += verify_start - target_start
            s.verify_s += verify_end - verify_start
            if emitted[-1] in eos or s.new_tokens == max_new_tokens:
                s.wall_s = time.perf_counter() - start
            else:
                still.append(b)
        if len(still) < len(active):
            keep_rows = torch.tensor(still, dtype=torch.int64)
            for lm in (target_lm, draft_lm):
                if lm is not None:
                    lm.select(keep_rows)
        # The policy is charged the whole round: drafting, then everything after it.
        policy.observe(k, sum(accepted) / len(active), target_start - round_start, time.perf_counter() - target_start,
                       len(active))
        active = [active[b] for b in still]

    outputs = []
    for ids, s in zip(committed, stats):
        new = ids[s.prompt_tokens:]
        outputs.append(GenerationOutput(new, _decode(tokenizer, new), s))
    return BatchGenerationOutput(outputs, time.perf_counter() - start, draft_lengths)
