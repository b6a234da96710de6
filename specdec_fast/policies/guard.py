"""The guard that keeps speculation from being slower than not speculating.

Whatever the policy and the draft, a round that drafts is worth what it emits beyond what plain
rounds (one target pass, one token: autoregressive steps) would have emitted in its time:

    value = N - B t / P(B)

for a round of B sequences that emitted N tokens in t seconds, P(B) the seconds of a plain round
of B sequences: predicted by the calibration (:mod:`specdec_fast.policies.calibration`) until the
loop has timed plain rounds of that size itself, then their running mean (the machine's speed
moves). :class:`SpeculationGuard` keeps the running mean of that value over the drafting rounds;
once it is negative over at least ``patience`` of them, the loop stops drafting, and probes one
drafting round after ``probe_every`` plain rounds, then after twice as many each time a probe
loses (up to ``max_gap``), so that a draft that starts to pay (a passage to copy from) is found
again at a cost that falls with time. A probe that pays turns drafting back on.

The guard reads past rounds only, never the current round's target output, so it changes how
many tokens are drafted, not which are accepted: the output law is the target's.
"""

from __future__ import annotations

from .calibration import Calibration


class SpeculationGuard:
    """Holds drafting off while it loses against plain rounds (see the module docstring).

    ``allow(k, rows)`` -> the draft length to use this round (k, or 0 while held off); the loop
    then reports the round with ``observe(drafted, emitted, seconds, rows)``: drafted, whether it
    drafted (a draft pass spent, even on a withheld token), emitted the tokens it emitted over its
    rows, seconds its wall time.
    """

    def __init__(self, calibration: Calibration | None = None, probe_every: int = 16, max_gap: int = 256,
                 patience: int = 2, smoothing: float = 0.7):
        self.calibration, self.probe_every, self.max_gap = calibration, probe_every, max_gap
        self.patience, self.smoothing = patience, smoothing
        self.plain_s: dict[int, float] = {}  # rows -> running seconds of a plain round, as measured
        self.value, self.rounds = 0.0, 0  # running value of this drafting period, and its rounds
        self.drafting, self.probing = True, False
        self.waited, self.gap = 0, probe_every  # plain rounds since drafting stopped; plain rounds until the next probe

    def plain(self, rows: int) -> float | None:
        """P(rows): measured here, else predicted from the calibration (a pass over ``rows`` tokens
        scaled by the plain round's share of fixed costs), else None."""
        if rows in self.plain_s:
            return self.plain_s[rows]
        if self.calibration is None:
            return None
        c = self.calibration
        return c.plain_round_s * c.target(rows) / c.target(1)

    def allow(self, k: int, rows: int = 1) -> int:
        if not k:
            return 0
        if self.plain(rows) is None:  # nothing to weigh a drafting round against yet: time a plain round first
            return 0
        if self.drafting:
            return k
        self.waited += 1
        if self.waited > self.gap:
            self.probing = True
            return k
        return 0

    def observe(self, drafted: bool, emitted: int, seconds: float, rows: int = 1) -> None:
        if not drafted:
            before = self.plain_s.get(rows)
            self.plain_s[rows] = seconds if before is None else self.smoothing * before + (1 - self.smoothing) * seconds
            return
        plain = self.plain(rows)
        if plain is None:
            return
        value = emitted - rows * seconds / plain
        if self.probing:  # one round, judged alone: a fresh start if it paid, a longer wait if not
            self.probing, self.waited = False, 0
            if value >= 0:
                self.drafting, self.value, self.rounds, self.gap = True, value, 1, self.probe_every
            else:
                self.gap = min(2 * self.gap, self.max_gap)
            return
        self.value = self.smoothing * self.value + (1 - self.smoothing) * value if self.rounds else value
        self.rounds += 1
        if self.rounds >= self.patience and self.value < 0:
            self.drafting, self.waited, self.rounds = False, 0, 0
