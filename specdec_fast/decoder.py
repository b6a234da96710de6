"""``SpeculativeDecoder``: the seed's class name, over :func:`fast_generate`."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from .generate import GenerationOutput, fast_generate
from .policy import DraftPolicy


class SpeculativeDecoder:
    """A target/draft pair with fixed sampling settings, and totals over its calls.

    Example:
        >>> decoder = SpeculativeDecoder(target, draft, num_draft_tokens=4, temperature=0.7)
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
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ):
        self.target_model, self.draft_model = target_model, draft_model
        self.settings = dict(num_draft_tokens=num_draft_tokens, policy=policy, verifier=verifier, temperature=temperature,
                             top_k=top_k, top_p=top_p)
        self.totals = dict(new_tokens=0, rounds=0, target_calls=0, draft_calls=0, drafted=0, accepted=0, wall_s=0.0)

    def generate(
        self,
        input_ids: Tensor | Sequence[int] | None = None,
        *,
        prompt: str | None = None,
        tokenizer=None,
        max_new_tokens: int = 128,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> GenerationOutput:
        """One generation with :func:`fast_generate` and this decoder's settings."""
        out = fast_generate(
            self.target_model, self.draft_model, input_ids, prompt=prompt, tokenizer=tokenizer,
            max_new_tokens=max_new_tokens, seed=seed, eos_token_id=eos_token_id, **self.settings,
        )
        for name in self.totals:
            self.totals[name] += getattr(out.stats, name)
        return out

    def get_efficiency_metrics(self) -> dict[str, float]:
        """Totals over all calls: counts, acceptance rate, tokens per target pass, tokens/s."""
        t = self.totals
        return dict(
            t,
            acceptance_rate=t["accepted"] / t["drafted"] if t["drafted"] else 0.0,
            mean_accepted_length=t["new_tokens"] / t["rounds"] if t["rounds"] else 0.0,
            tokens_per_second=t["new_tokens"] / t["wall_s"] if t["wall_s"] else 0.0,
        )
