"""``SpeculativeDecoder`` and ``ProductionSpeculativeDecoder``: the seed's class names, over
:func:`fast_generate` and :func:`batch_generate`."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..policies.mdp import DraftPolicy
from ..policies.shipped import default_policy
from .batch import batch_generate
from .outputs import BatchGenerationOutput, GenerationOutput
from .speculative import fast_generate
from .warmup import warmup


class SpeculativeDecoder:
    """A target/draft pair with fixed sampling settings (those of :func:`fast_generate`), and
    totals over its calls.

    Example:
        >>> decoder = SpeculativeDecoder(target, draft, num_draft_tokens=4, do_sample=True, temperature=0.7)
        >>> out = decoder.generate(prompt="Hello", tokenizer=tok, max_new_tokens=64, seed=0)
        >>> decoder.get_efficiency_metrics()["acceptance_rate"]
    """

    def __init__(
        self,
        target_model,
        draft_model,
        num_draft_tokens: int = 4,
        policy: DraftPolicy | None = None,
        verifier: str = "token",
        num_alternatives: int = 0,
        generation_config=None,
        **generation,
    ):
        """``generation_config`` and ``generation`` (do_sample, temperature, top_k, top_p, ...): the
        settings of every call, in transformers' vocabulary (see :mod:`specdec_fast.decoding.config`)."""
        self.target_model, self.draft_model = target_model, draft_model
        self.settings = dict(num_draft_tokens=num_draft_tokens, policy=policy, verifier=verifier,
                             num_alternatives=num_alternatives, generation_config=generation_config, **generation)
        self.totals = dict(new_tokens=0, rounds=0, target_calls=0, draft_calls=0, drafted=0, accepted=0, alternatives=0,
                           alternatives_accepted=0, wall_s=0.0)

    def generate(
        self,
        input_ids=None,
        *,
        messages: Sequence[dict] | None = None,
        prompt: str | None = None,
        tokenizer=None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> GenerationOutput:
        """One generation with :func:`fast_generate` and this decoder's settings."""
        out = fast_generate(
            self.target_model, self.draft_model, input_ids, messages=messages, prompt=prompt, tokenizer=tokenizer,
            max_new_tokens=max_new_tokens, seed=seed, eos_token_id=eos_token_id, **self.settings,
        )
        self._add(out.stats, out.stats.wall_s)
        return out

    def _add(self, stats, wall_s: float) -> None:
        """Add a generation's counters, and ``wall_s`` (a batch's time is counted once, not per request)."""
        for name in self.totals:
            self.totals[name] += wall_s if name == "wall_s" else getattr(stats, name)

    def get_efficiency_metrics(self) -> dict[str, float]:
        """Totals over all calls: counts, acceptance rate, tokens per target pass, tokens/s."""
        t = self.totals
        return dict(
            t,
            acceptance_rate=t["accepted"] / t["drafted"] if t["drafted"] else 0.0,
            mean_accepted_length=t["new_tokens"] / t["rounds"] if t["rounds"] else 0.0,
            tokens_per_second=t["new_tokens"] / t["wall_s"] if t["wall_s"] else 0.0,
        )


class ProductionSpeculativeDecoder(SpeculativeDecoder):
    """A decoder for serving (the seed's name): one draft-length policy kept across calls, so the
    costs it measures carry over; requests batched through both models together.

    ``policy`` defaults to the shipped learned cost-aware policy of the draft's kind
    (:func:`default_policy`; the feature draft's for a :class:`FeatureDraft`, else the token
    draft's): its cost priors were measured on the SmolLM2 pair and adapt to the measured costs
    online, per batch size, so it drafts less (down to nothing) where speculation loses.

    Example:
        >>> decoder = ProductionSpeculativeDecoder(target, draft, batch_size=8)
        >>> decoder.warmup()
        >>> outs = decoder.batch_generate(prompts, tokenizer=tok, max_new_tokens=64, seeds=range(len(prompts)))
    """

    def __init__(self, target_model, draft_model, max_draft_tokens: int = 8, policy: DraftPolicy | None = None,
                 batch_size: int = 8, verifier: str = "token", generation_config=None, **generation):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if policy is None:
            policy = default_policy(verifier, draft=draft_model, max_draft_tokens=max_draft_tokens)
        super().__init__(target_model, draft_model, max_draft_tokens, policy, verifier, generation_config=generation_config,
                         **generation)
        self.batch_size = int(batch_size)

    def batch_generate(
        self,
        prompts: Sequence[str] | None = None,
        *,
        input_ids: Sequence | None = None,
        messages: Sequence[Sequence[dict]] | None = None,
        tokenizer=None,
        max_new_tokens: int | None = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> BatchGenerationOutput:
        """The requests in batches of ``batch_size`` (:func:`~specdec_fast.decoding.batch.batch_generate`),
        one output per request, in order, as one BatchGenerationOutput (wall time and draft lengths
        over all batches); added to the totals of :meth:`get_efficiency_metrics`."""
        given = {name: value for name, value in (("prompts", prompts), ("input_ids", input_ids), ("messages", messages))
                 if value is not None}
        if len(given) != 1:
            raise ValueError("pass exactly one of prompts, input_ids or messages")
        (kind, requests), = given.items()
        requests = list(requests)
        seeds = list(seeds) if seeds is not None else [torch.seed() for _ in requests]
        if len(seeds) != len(requests):
            raise ValueError(f"seeds must have one entry per request ({len(requests)}), got {len(seeds)}")
        settings = {name: value for name, value in self.settings.items() if name != "num_alternatives"}
        outputs, wall_s, draft_lengths = [], 0.0, []
        for i in range(0, max(len(requests), 1), self.batch_size):
            out = batch_generate(self.target_model, self.draft_model, **{kind: requests[i : i + self.batch_size]},
                                 tokenizer=tokenizer, max_new_tokens=max_new_tokens, seeds=seeds[i : i + self.batch_size],
                                 eos_token_id=eos_token_id, **settings)
            for b, o in enumerate(out.outputs):
                self._add(o.stats, out.wall_s if b == 0 else 0.0)
            outputs += out.outputs
            wall_s += out.wall_s
            draft_lengths += out.draft_lengths
        return BatchGenerationOutput(outputs, wall_s, draft_lengths)

    def warmup(self) -> float:
        """:func:`~specdec_fast.decoding.warmup.warmup`, plus one small batch; returns its seconds."""
        start = time.perf_counter()
        warmup(self.target_model, self.draft_model)
        batch_generate(self.target_model, self.draft_model, input_ids=[[1, 2, 3], [4, 5]], max_new_tokens=4, seeds=[0, 1],
                       temperature=[1.0, 0.0], num_draft_tokens=2, eos_token_id=())
        return time.perf_counter() - start
