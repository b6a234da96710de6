"""``AdaptiveMonitoringSystem``: rolling speculative-decoding metrics, a controller of the
maximum draft length, and export as a dict or as Prometheus text.

It is a draft policy that wraps another one (``fast_generate(..., policy=monitor)``): the
inner policy decides CONTINUE/STOP as usual, the monitor caps how many tokens it may draft
and records every round. Like every policy it sees only draft-side information and past
rounds, so it changes speed, never the output distribution.

The controller climbs the measured throughput: rounds run at a cap (the most tokens the
inner policy may draft, 0 = no speculation) for ``period`` rounds; then the cap moves to
the best cap measured in the last ``window`` rounds, or first to a neighbour of it (best
-/+ 1) that has no measurement in that window. Throughput is emitted tokens per second of
draft and target time at that cap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

try:  # an extra (specdec_fast[monitoring]): the monitor works without it, its Prometheus export does not
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:
    CollectorRegistry = None

from ..kernels import DraftStepOutput
from .baselines import FixedDraftLength
from .calibration import Calibration
from .counts import RoundCounts
from .mdp import DraftPolicy


@dataclass(frozen=True)
class Round:
    """One verification round: the cap it ran under, tokens drafted/accepted (mean over the
    ``rows`` sequences of a batch round), measured seconds."""

    cap: int
    drafted: int
    accepted: float
    draft_s: float
    target_s: float
    rows: int = 1


class AdaptiveMonitoringSystem:
    """Wraps ``policy`` (default: always draft up to the cap), records rounds, adapts the cap.

    Args:
        policy: the inner draft policy.
        max_draft_tokens: the largest cap the controller may choose; the cap starts here.
        window: rounds kept for the rolling metrics and for the controller's measurements.
        period: rounds between controller decisions.
        adapt: False keeps the cap at ``max_draft_tokens`` (monitoring only).
    """

    def __init__(self, policy: DraftPolicy | None = None, max_draft_tokens: int = 8, window: int = 256,
                 period: int = 16, adapt: bool = True):
        if int(max_draft_tokens) != max_draft_tokens or max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be an integer >= 0, got {max_draft_tokens}")
        if period < 1 or window < 2 * period:
            raise ValueError(f"need period >= 1 and window >= 2 * period, got period={period}, window={window}")
        self.policy = policy if policy is not None else FixedDraftLength(max_draft_tokens)
        self.max_cap, self.window, self.period, self.adapt = int(max_draft_tokens), window, period, adapt
        self.cap = self.max_cap
        self.rounds: deque[Round] = deque(maxlen=window)
        self.totals = RoundCounts()  # over every round seen

    # The DraftPolicy protocol.
    def use_calibration(self, calibration: Calibration | None) -> None:
        self.policy.use_calibration(calibration)

    def begin_round(self, remaining: int, rows: int | None = None) -> int:
        return min(self.cap, self.policy.begin_round(remaining, rows))

    def propose_first(self, step: DraftStepOutput, temperature: float) -> bool:
        return self.policy.propose_first(step, temperature)

    def continue_drafting(self, position: int, step: DraftStepOutput, temperature: float) -> bool:
        return self.policy.continue_drafting(position, step, temperature)

    def observe(self, drafted: int, accepted: float, draft_s: float, target_s: float, rows: int | None = None) -> None:
        self.policy.observe(drafted, accepted, draft_s, target_s, rows)
        self.rounds.append(Round(self.cap, drafted, accepted, draft_s, target_s, rows or 1))
        self.totals.record_round(drafted, accepted, accepted + 1)
        self.totals.draft_s += draft_s
        self.totals.target_s += target_s
        if self.adapt and self.totals.rounds % self.period == 0:
            self.cap = self._next_cap()

    # The controller.
    def throughput_by_cap(self) -> dict[int, float]:
        """Emitted tokens per second of draft + target time, per cap, over the window."""
        tokens: dict[int, int] = {}
        seconds: dict[int, float] = {}
        for r in self.rounds:
            tokens[r.cap] = tokens.get(r.cap, 0) + r.rows * (r.accepted + 1)
            seconds[r.cap] = seconds.get(r.cap, 0.0) + r.draft_s + r.target_s
        return {cap: tokens[cap] / seconds[cap] for cap in tokens if seconds[cap] > 0}

    def _next_cap(self) -> int:
        measured = self.throughput_by_cap()
        best = max(measured, key=measured.__getitem__) if measured else self.cap
        unmeasured = [c for c in (best - 1, best + 1) if 0 <= c <= self.max_cap and c not in measured]
        return unmeasured[0] if unmeasured else best

    # Export.
    def metrics(self) -> dict:
        """Rolling metrics over the last ``window`` rounds, the current cap and the totals."""
        rounds = list(self.rounds)
        drafted = sum(r.drafted for r in rounds)
        accepted = sum(r.accepted for r in rounds)
        seconds = sum(r.draft_s + r.target_s for r in rounds)
        depth = max((r.drafted for r in rounds), default=0)
        at = [sum(r.drafted > i for r in rounds) for i in range(depth)]
        ok = [sum(r.accepted > i for r in rounds) for i in range(depth)]
        return dict(
            window_rounds=len(rounds),
            acceptance_rate=accepted / drafted if drafted else 0.0,
            mean_accepted_length=(accepted + len(rounds)) / len(rounds) if rounds else 0.0,
            per_position_acceptance=[a / d for a, d in zip(ok, at)],
            tokens_per_second=sum(r.rows * (r.accepted + 1) for r in rounds) / seconds if seconds > 0 else 0.0,
            mean_draft_s=sum(r.draft_s for r in rounds) / len(rounds) if rounds else 0.0,
            mean_target_s=sum(r.target_s for r in rounds) / len(rounds) if rounds else 0.0,
            max_draft_tokens=self.cap,
            throughput_by_cap=self.throughput_by_cap(),
            totals=asdict(self.totals),
        )

    def collect(self):
        """prometheus_client collector protocol: counters (totals) and gauges (rolling window)."""
        _need_prometheus()
        prefix = "specdec_fast:spec_decode_"
        t = self.totals
        for name, value, doc in (
            ("num_drafts", t.rounds, "Verification rounds."),
            ("num_draft_tokens", t.drafted, "Draft tokens proposed."),
            ("num_accepted_tokens", t.accepted, "Draft tokens accepted."),
            ("num_emitted_tokens", t.new_tokens, "Tokens emitted (accepted + one per round)."),
            ("draft_seconds", t.draft_s, "Seconds in draft passes."),
            ("target_seconds", t.target_s, "Seconds in target passes and verification."),
        ):
            yield CounterMetricFamily(prefix + name, doc, value=value)
        per_position = CounterMetricFamily(prefix + "num_accepted_tokens_per_pos",
                                           "Draft tokens accepted, by draft position.", labels=["position"])
        for i, a in enumerate(t.accepted_at):
            per_position.add_metric([str(i)], a)
        yield per_position
        m = self.metrics()
        for name, doc in (
            ("acceptance_rate", "Accepted / drafted tokens over the rolling window."),
            ("mean_accepted_length", "Tokens emitted per verification round over the rolling window."),
            ("tokens_per_second", "Emitted tokens per second of draft and target time over the rolling window."),
            ("max_draft_tokens", "Current cap on drafted tokens per round."),
        ):
            yield GaugeMetricFamily(prefix + name, doc, value=m[name])

    def prometheus(self) -> str:
        """The metrics in Prometheus text exposition format."""
        _need_prometheus()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry).decode()


def _need_prometheus() -> None:
    if CollectorRegistry is None:
        raise ImportError("Prometheus export needs prometheus-client: pip install 'specdec_fast[monitoring]'")
