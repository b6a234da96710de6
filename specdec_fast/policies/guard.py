"""The guard that keeps speculation from being slower than not speculating.

Whatever the policy and the draft, a round that drafts is worth what it emits beyond what plain
rounds (one target pass, one token: autoregressive steps) would have emitted in its time:

    value = N - B t / P(B)

for a round of B sequences that emitted N tokens in t seconds, P(B) the seconds of a plain round
of B sequences: predicted by the calibration (:mod:`specdec_fast.policies.calibration`) until the
loop has timed plain rounds of that size itself, then their running mean (the machine's speed
moves). :class:`SpeculationGuard` keeps the running mean of that value over the drafting rounds;
once it is negative over ``patience`` of them, the loop stops drafting.

While drafting is off, the guard probes: after ``probe_every`` plain rounds it lets one round
draft a single token (the cheapest drafting round, which measures the draft's acceptance), then
waits twice as long after each probe that does not bring drafting back (up to ``max_gap``). Drafting
comes back when the probe paid and, with a calibration, when the rounds the policy asks for would
pay at the acceptance measured so far: E[N](alpha, k) tokens against the calibrated seconds of
such a round, alpha counting the drafts of past periods too (with a prior of half a token in
one: one lucky probe is not an acceptance of 1). Drafting comes back slowly: two tokens after the
probe's one, then twice as many after each round that paid, up to the policy's length. A
period that comes back and loses overall (its probe's gain and its rounds' values summed)
doubles the gap as a failed probe does; only one that paid sets it back to ``probe_every``.
A probe is not free (a feature draft catches up on the tokens it skipped: a probe of one token
cost 1.5-2.2 plain rounds on a 2-core EPYC), so the gap after a probe that lost v tokens is at
least v / ``probe_budget`` rounds: probes that do not pay cost at most that share of the time
(a period's loss only doubles the gap: a lookup's long rounds can lose tokens where its probe,
a pass over two tokens, costs little).
A round that spent nothing on drafting (a lookup that found nothing to propose) is timed as a
plain round and judges nothing: a probe stays pending until the lookup proposes.
A loop's first drafting round is a probe too, so a draft that cannot pay costs one cheap round,
not several long ones.

The guard reads past rounds only, never the current round's target output, so it changes how
many tokens are drafted, not which are accepted: the output law is the target's.
"""

from __future__ import annotations

import math

from .calibration import Calibration
from .costs import expected_tokens


class SpeculationGuard:
    """Holds drafting off while it loses against plain rounds (see the module docstring).

    ``allow(k, rows)`` -> the draft length to use this round (k, 1 for a probe, or 0 while held
    off); the loop then reports the round with ``observe(spent, drafted, accepted, emitted,
    seconds, rows)``: spent, whether the round spent drafting work (a token drafted, or a draft
    pass run for a token the policy withheld); drafted and accepted, draft tokens over its rows;
    emitted, the tokens it emitted over its rows; seconds, its wall time.
    """

    def __init__(self, calibration: Calibration | None = None, probe_every: int = 16, max_gap: int = 256,
                 patience: int = 2, smoothing: float = 0.7, memory: float = 0.9, probe_budget: float = 0.01):
        self.calibration, self.probe_every, self.max_gap = calibration, probe_every, max_gap
        self.patience, self.smoothing, self.memory, self.probe_budget = patience, smoothing, memory, probe_budget
        self.limit = 1  # the most a drafting round may draft now (doubling from the probe's one)
        self.plain_s: dict[int, float] = {}  # rows -> running seconds of a plain round, as measured
        self.value, self.rounds = 0.0, 0  # running value of this drafting period, and its rounds
        self.total = 0.0  # the value of this drafting period summed, its probe's included
        self.accepted, self.drafted = 0.0, 0.0  # sums of accepted and drafted tokens, decaying by memory per drafting round
        self.drafting, self.probing, self.asked = False, False, 0
        self.waited, self.gap = probe_every, 0  # plain rounds since drafting stopped; plain rounds until the next probe

    def plain(self, rows: int) -> float | None:
        """P(rows): measured here, else predicted from the calibration (a pass over ``rows`` tokens
        scaled by the plain round's share of fixed costs), else None."""
        if rows in self.plain_s:
            return self.plain_s[rows]
        if self.calibration is None:
            return None
        c = self.calibration
        return c.plain_round_s * c.target(rows) / c.target(1)

    @property
    def acceptance(self) -> float:
        """Per-token acceptance of the drafts so far, with a prior of half a token accepted of one
        (0.5 before any draft)."""
        return (self.accepted + 0.5) / (self.drafted + 1.0)

    def pays(self, k: int, rows: int) -> bool:
        """Would rounds of up to k drafts per row pay at the acceptance measured so far, by the
        calibrated costs: E[N](alpha, j) >= (T(rows (j + 1)) + j c + fixed) / P(rows) for some j <= k
        (True without a calibration: the probe's own value decides)?"""
        c, plain = self.calibration, self.plain(rows)
        if c is None or plain is None:
            return True
        return any(expected_tokens(self.acceptance, j) * plain >= c.target(rows * (j + 1)) + j * c.draft_step_s + c.round_fixed_s
                   for j in range(1, k + 1))

    def allow(self, k: int, rows: int = 1) -> int:
        if not k or self.plain(rows) is None:  # nothing to weigh a drafting round against yet: a plain round is timed
            return 0
        self.asked = k
        if self.drafting:
            return min(k, self.limit)
        self.waited += 1
        if self.waited > self.gap:
            self.probing = True
            return 1
        return 0

    def observe(self, spent: bool, drafted: int, accepted: int, emitted: int, seconds: float, rows: int = 1) -> None:
        a = self.smoothing
        if not spent:
            before = self.plain_s.get(rows)
            self.plain_s[rows] = seconds if before is None else a * before + (1 - a) * seconds
            return
        plain = self.plain(rows)
        if plain is None:
            return
        m = self.memory
        self.accepted, self.drafted = m * self.accepted + accepted, m * self.drafted + drafted
        value = emitted - rows * seconds / plain
        if self.probing:  # one cheap round, judged alone; drafting resumes if the rounds asked for would pay too
            self.probing, self.waited = False, 0
            if value >= 0 and self.pays(self.asked, rows):
                self.drafting, self.value, self.rounds, self.total, self.limit = True, 0.0, 0, value, 2
            else:
                self.longer_gap(value)
            return
        self.value = a * self.value + (1 - a) * value if self.rounds else value
        self.rounds, self.total = self.rounds + 1, self.total + value
        if value >= 0:
            self.limit = min(2 * self.limit, max(self.asked, 1))
        if self.rounds >= self.patience and self.value < 0:
            self.drafting, self.waited, self.rounds = False, 0, 0
            if self.total >= 0:
                self.gap = self.probe_every
            else:  # doubled only: a lookup's long rounds can lose tokens where its probe costs little
                self.longer_gap(0.0)

    def longer_gap(self, value: float) -> None:
        """Drafting that did not pay (``value`` tokens, its gain): wait twice as long for the next
        probe (``probe_every`` after the loop's first probe), and at least what the loss buys at
        ``probe_budget``, up to ``max_gap``."""
        doubled = 2 * self.gap if self.gap else self.probe_every
        self.gap = min(max(doubled, math.ceil(-value / self.probe_budget)), self.max_gap)
