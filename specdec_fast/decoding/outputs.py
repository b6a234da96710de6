"""What a generation returns: its tokens and text, and the counters and timings of its rounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..policies.counts import RoundCounts


@dataclass
class GenerationStats(RoundCounts):
    """Counters and timings of one generation (its rounds' counts: :class:`RoundCounts`).

    target_calls and draft_calls count forward passes (prefill included); a round is one
    draft phase plus one verification pass of the target.
    """

    prompt_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    withheld: int = 0  # rounds whose first drafted token the policy chose not to verify (a draft pass spent)
    alternatives: int = 0  # first-token alternatives verified (not counted in drafted)
    alternatives_accepted: int = 0  # rounds whose first token was an alternative (not counted in accepted)
    prefill_s: float = 0.0
    verify_s: float = 0.0  # the verify op
    wall_s: float = 0.0

    @property
    def target_pass_s(self) -> float:
        """Mean seconds of one target pass after the prefill (target_s over those passes)."""
        return self.target_s / (self.target_calls - 1) if self.target_calls > 1 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens / wall time (prefill included)."""
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    def record_round(self, drafted: int, accepted: int, emitted: int) -> None:
        super().record_round(drafted, accepted, emitted)
        self.target_calls += 1

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
