"""Counters of verification rounds: what the rounds drafted, accepted and emitted, by draft
position, and their seconds. A generation's statistics extend them; the monitor keeps its own."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundCounts:
    """Counts over rounds. ``accepted`` and ``new_tokens`` may be fractional where a round stands for
    a batch (the mean over its rows)."""

    rounds: int = 0
    drafted: int = 0
    accepted: float = 0
    new_tokens: float = 0  # emitted: accepted drafts plus one token per round
    drafted_at: list[int] = field(default_factory=list)  # per draft position: rounds that drafted it
    accepted_at: list[int] = field(default_factory=list)  # per draft position: rounds that accepted it
    draft_s: float = 0.0  # draft passes and draft steps
    target_s: float = 0.0  # target verification passes

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 if nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification round."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft position i accepted | position i drafted), i = 0..max drafted - 1."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def record_round(self, drafted: int, accepted: float, emitted: float) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.new_tokens += emitted
        self.drafted_at += [0] * max(0, drafted - len(self.drafted_at))
        self.accepted_at += [0] * max(0, drafted - len(self.accepted_at))
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted
