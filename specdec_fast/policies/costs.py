"""The cost model of the cost-aware policy: seconds of a draft step and of a target pass over
n tokens, learnt as the loop measures them, and the arithmetic of expected tokens per round."""

from __future__ import annotations

import math


def interpolate(table: dict[int, float], n: int) -> float:
    """table[n], linear between the sizes measured and beyond them (from the two outermost), >= 0."""
    if n in table:
        return table[n]
    known = sorted(table)
    if len(known) == 1:
        return table[known[0]]
    below, above = [m for m in known if m < n], [m for m in known if m > n]
    lo, hi = (below[-1], above[0]) if below and above else (known[-2], known[-1]) if below else (known[0], known[1])
    return max(0.0, table[lo] + (n - lo) * (table[hi] - table[lo]) / (hi - lo))


class _LogCosts:
    """One kind of cost: seconds(n) = exp(speed) x table(n), linear in n between and beyond the sizes known.

    The speed is how fast the machine runs now (this VM runs the same pass up to 1.5x slower a
    minute later, in steps, while the ratio of two sizes' costs stays put); mu[n] is a measured
    size's log cost at speed 0. A measurement of size n right after one of another size compares
    the two at one speed: mu[n] moves by 1 / (times n was measured so) of the surprise, the speed
    by ``gain`` of the rest; one right after one of the same size teaches the speed alone, so
    sizes measured long ago follow the machine instead of keeping the seconds they cost then. The
    first measurement of a size sets its mu. A size not measured costs the line between the
    measured sizes around it, or beyond them its prior (measured when the policy was trained)
    scaled as the nearest measured size is: priors give the shape only where nothing is measured
    (a loop that always drafts never measures T(1); a prior T(2) of an older kernel, 1.5x T(1),
    once made drafting one token look dear between measured T(1) and T(3)).
    """

    def __init__(self, priors: dict[int, float], gain: float = 0.5):
        self.priors = priors
        self.mu: dict[int, float] = {}
        self.count: dict[int, int] = {}  # measurements of n right after another size's, and the first
        self.speed, self.gain, self.last = 0.0, gain, None

    def seconds(self, size: int) -> float:
        table = {n: math.exp(mu) for n, mu in self.mu.items()}
        if table:
            lo, hi = min(table), max(table)
            for n, prior in self.priors.items():
                if not lo <= n <= hi:
                    edge = lo if n < lo else hi
                    table[n] = prior * table[edge] / interpolate(self.priors, edge)
        else:
            table = dict(self.priors)
        return math.exp(self.speed) * interpolate(table, size)

    def learn(self, size: int, seconds: float) -> None:
        log_seconds = math.log(max(seconds, 1e-9))
        if size not in self.mu:
            self.mu[size], self.count[size] = log_seconds - self.speed, 1
        else:
            surprise = log_seconds - self.speed - self.mu[size]
            if size != self.last:
                self.count[size] += 1
                self.mu[size] += surprise / self.count[size]
                surprise -= surprise / self.count[size]
            self.speed += self.gain * surprise
        self.last = size


class CostModel:
    """Seconds of a draft step over r sequences, c(r), and of a target pass over n token rows,
    T(n) (a round of one sequence with k drafts is a pass over n = k + 1 rows, of a batch of
    B sequences over n = B (k + 1)), learnt as the loop measures them (see :class:`_LogCosts`).

    The priors come from one sequence (measured when the policy was trained); a batch's passes
    turn compute-bound at sizes they only extrapolate (at 8 rows a 2-token pass measured 2.2x a
    1-token pass where the prior said 1.4x), so a size measured costs what was measured there, at
    today's speed, and the priors' sizes follow the speed too (a loop that always drafts never
    measures T(1) itself).
    """

    def __init__(self, draft_step_s: float | dict[int, float], target_pass_s: dict[int, float]):
        self.kinds = {"draft": _LogCosts(dict(draft_step_s) if isinstance(draft_step_s, dict) else {1: float(draft_step_s)}),
                      "target": _LogCosts(dict(target_pass_s))}

    def draft(self, rows: int = 1) -> float:
        """c(rows): one draft step of ``rows`` sequences."""
        return self.kinds["draft"].seconds(rows)

    def target(self, n: int) -> float:
        """T(n): one target pass over n token rows."""
        return self.kinds["target"].seconds(n)

    def measured(self, n: int) -> bool:
        """Has the loop measured T(n)?"""
        return n in self.kinds["target"].mu

    def update(self, drafted: int, draft_s: float, target_s: float, rows: int = 1) -> None:
        if drafted:
            self.kinds["draft"].learn(rows, draft_s / drafted)
        self.kinds["target"].learn(rows * (drafted + 1), target_s)


def expected_tokens(alpha: float, k: int) -> float:
    """E[N], tokens per round, for i.i.d. acceptance alpha and draft length k: 1 + alpha + ... + alpha^k."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def geometric_acceptance(mean_accepted: float, drafted: int) -> float:
    """The per-token acceptance alpha with alpha + alpha^2 + ... + alpha^drafted = mean_accepted
    (accepted drafts of a round under independent acceptance), by bisection."""
    if mean_accepted >= drafted:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if expected_tokens(mid, drafted) - 1 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
