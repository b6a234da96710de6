"""Learned, cost-aware draft-length policies (docs/design.md, "The MDP"; SpecDec++, Huang et al. 2024).

The objective is long-run tokens per second. With lambda the achievable throughput, each
round maximises E[N - lambda T] (renewal reward / Dinkelbach): after drafting token i with
survival s_i (the predicted probability that tokens 1..i are all accepted), drafting one
more adds s_i a_{i+1} expected tokens for one draft step plus the larger target pass,

    CONTINUE  iff  s_i a_{i+1} >= lambda (c + T(i + 2) - T(i + 1)),

with a_{i+1} the acceptance of the token not drafted yet, predicted from the current token's
features (a head of its own: for a feature draft the next position, drafted from the draft's
own features, is accepted far less often than the current one, so a_i is no proxy for it),
c and T(n) (seconds of a draft step and of a target pass over n tokens) measured, and lambda
the running throughput. The first draft position is decided after its draft pass, on that
position's distribution (``propose_first``; the pass itself is spent). Whether to draft at all
is decided before the round, on what drafting rounds have been worth: the running mean of
N - t / T(1) over them (N tokens in t seconds, against the t / T(1) tokens plain rounds make in
that time). Where a fast target pass or a dear draft makes drafting lose, rounds draft nothing,
with a one-token probe now and then so the estimate can recover. For block verification
s_i is the clipped cumulative ratio min(1, s_{i-1} rho_i), rho = E[min(R, p/q)], and the gain
of token i + 1 is min(1, s_i rho_{i+1}).
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import DraftStepOutput
from .calibration import Calibration
from .costs import CostModel, expected_tokens, geometric_acceptance
from .mdp import FEATURES, MDPState, SpeculativePolicy

RATIO_CAP = 4.0  # the ratio head predicts E[min(RATIO_CAP, p/q)] / RATIO_CAP
PRIOR_TOKENS = 4.0  # the batch rule's prior on alpha (0.5) weighs as much as this many drafted tokens
PRIOR_DRAFT_VALUE = 0.0  # tokens a drafting round is worth before one was measured: draft, and learn


class FeatureMLP(nn.Module):
    """Two hidden ReLU layers on standardised MDPState features (statistics stored with the weights)."""

    def __init__(self, outputs: int, hidden: int = 32):
        super().__init__()
        self.register_buffer("mean", torch.zeros(len(FEATURES)))
        self.register_buffer("std", torch.ones(len(FEATURES)))
        self.net = nn.Sequential(nn.Linear(len(FEATURES), hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, outputs))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[N, F] -> [N, outputs]."""
        return self.net((features - self.mean) / self.std)


PREDICTOR_OUTPUTS = ("accept", "ratio", "next_accept", "next_ratio")


class AcceptancePredictor(FeatureMLP):
    """[N, F] features -> [N, 4] in (0, 1), in PREDICTOR_OUTPUTS order: P(accept) = E[min(1, p/q)]
    of the token just drafted and E[min(RATIO_CAP, p/q)] / RATIO_CAP; the same two of the next
    token, were one drafted."""

    def __init__(self, hidden: int = 32):
        super().__init__(len(PREDICTOR_OUTPUTS), hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(features))


class ValueNetwork(FeatureMLP):
    """The seed's value network, made to fit: [N, F] features -> [N] value of CONTINUING from a state,
    in tokens minus lambda times seconds (fitted value iteration on traces, specdec_fast.train_policy)."""

    def __init__(self, hidden: int = 32):
        super().__init__(1, hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.logits(features).squeeze(-1)


class PolicyNetwork(ValueNetwork):
    """The seed's policy network: [N, F] features -> [N] logit of CONTINUE, distilled from the value network's decisions."""


class CostAwarePolicy(SpeculativePolicy):
    """The learned stopping rule of the module docstring, with an :class:`AcceptancePredictor`.

    A round of one sequence drafts while drafting rounds have paid (see the module docstring) and a
    sure acceptance would pay for a draft step and the larger pass; whether
    its first draft is verified, and whether drafting continues, is decided token by token.

    A batch round (``rows`` given, see policy.py) drafts one length k for every sequence, chosen before
    drafting: the k in [0, limit] with the most expected tokens per second,
    (1 + alpha + ... + alpha^k) / (k c(rows) + T(rows (k + 1))), with alpha the running
    per-token acceptance and the costs measured at this batch size. As the batch grows the
    target pass turns compute-bound, T(rows (k + 1)) grows with k, and the policy drafts
    less, down to nothing. A round at a batch size whose plain pass T(rows) is not measured
    yet drafts nothing (it costs what batched autoregressive decoding does): every length is
    weighed against T(rows), and one extrapolated from one sequence's priors made drafting
    look cheap at 16 rows, where it lost, with nothing in a loop that always drafts to correct it.

    ``probe_every``: after that many batch rounds without drafting, draft one token anyway, so
    the acceptance estimate can recover when the text gets easier; after that many drafting
    rounds in a row, one plain round, so the plain pass is timed again (on this VM the ratio of
    a 2-token to a 1-token pass over 8 rows moved between 1.28 and 1.6 within minutes). Each
    probe that does not bring drafting back doubles the gap to the next one (up to 16
    ``probe_every``): a probe of a large batch is dear. The first batch
    round that may draft is a probe, so alpha soon rests on a measurement (see ``token_acceptance``). No probe is
    made where the current costs say drafting would lose even if every draft were accepted
    (a large batch on a CPU): there is nothing to find out.

    ``calibrate``: start from the costs a loop measured where it runs (``use_calibration``), the
    given ``costs`` being only a prior (the shipped policy's); False keeps ``costs`` as given (a
    cost model of your own).
    """

    def __init__(self, predictor: AcceptancePredictor, costs: CostModel, verifier: str = "token",
                 max_draft_tokens: int = 8, probe_every: int = 16, calibrate: bool = True):
        super().__init__(max_draft_tokens)
        self.predictor, self.costs, self.block = predictor.eval(), costs, verifier == "block"
        self.calibrate = calibrate
        self.probe_every = probe_every
        self.alpha_sum, self.alpha_weight = 0.5 * PRIOR_TOKENS, PRIOR_TOKENS  # see token_acceptance
        self.batch_probed = False
        self.tokens, self.seconds = 1.0, costs.target(1)  # running throughput = tokens / seconds
        self.draft_value = PRIOR_DRAFT_VALUE  # running E[N - t / T(1)] of drafting rounds
        self.skipped, self.gap = 0, probe_every  # rounds without drafting; rounds until the next probe
        self.drafting = 0  # batch rounds in a row that drafted
        self.calibrated: dict | None = None  # the key of the calibration the costs started from

    def use_calibration(self, calibration: Calibration | None) -> None:
        """Start from the costs measured where the loop runs (the shipped priors were measured on
        another machine); once per calibration, so that a policy kept across generations keeps what
        it has learnt since."""
        if not self.calibrate or calibration is None or calibration.key == self.calibrated:
            return
        self.calibrated, self.costs = calibration.key, calibration.cost_model()
        self.tokens, self.seconds = 1.0, self.costs.target(1)

    def throughput(self) -> float:
        return self.tokens / self.seconds

    @property
    def token_acceptance(self) -> float:
        """alpha of the batch rule: each batch round's per-token acceptance weighted by the tokens it
        drafted (rows x length), decaying with ``smoothing`` per round, from a prior of 0.5 worth
        PRIOR_TOKENS tokens. A one-token probe of one row (alpha 0 or 1) moves it only part way:
        taken at face value, one lucky probe had a single sequence drafting 8 tokens a round."""
        return self.alpha_sum / self.alpha_weight

    def _worth(self, gain: float, drafted: int) -> bool:
        """Is one more draft token (after `drafted`) with expected gain `gain` worth its cost (the
        larger target pass and the draft step)?"""
        cost = self.costs.target(drafted + 2) - self.costs.target(drafted + 1) + self.costs.draft()
        return gain >= self.throughput() * cost

    def _probe(self, length: int, probe: int) -> int:
        """``length``; or, as length 0 runs ``gap`` rounds, ``probe`` (and the gap doubles); never
        a probe of 0 tokens (one that cannot pay). After ``probe_every`` drafting rounds in a row,
        one round of 0: the cost model compares two sizes only when one is timed right after the
        other, so a policy that always drafts would never see the ratio move."""
        if length:
            self.skipped, self.gap = 0, self.probe_every
            self.drafting += 1
            if self.drafting <= self.probe_every:
                return length
            self.drafting = 0
            return 0
        self.drafting = 0
        if not probe:
            return 0
        if self.skipped >= self.gap:
            self.skipped, self.gap = 0, min(2 * self.gap, 16 * self.probe_every)
            return probe
        self.skipped += 1
        return 0

    def begin_round(self, remaining: int, rows: int | None = None) -> int:
        limit = super().begin_round(remaining)
        if rows is not None:
            if not self.costs.measured(rows):
                return 0
            c = self.costs.draft(rows)

            def rate(alpha: float, k: int) -> float:  # expected tokens per second of a round drafting k
                return expected_tokens(alpha, k) / (k * c + self.costs.target(rows * (k + 1)))

            pays = any(rate(1.0, k) > rate(1.0, 0) for k in range(1, limit + 1))
            probe = min(1, limit) if pays else 0
            if probe and not self.batch_probed:
                self.batch_probed = True
                return probe
            return self._probe(max(range(limit + 1), key=lambda k: rate(self.token_acceptance, k)), probe)
        could_pay = self._worth(1.0, 0)  # a sure acceptance pays for a step and the larger pass
        return self._probe(limit if could_pay and self.draft_value >= 0 else 0, min(1, limit) if could_pay else 0)

    @torch.no_grad()
    def predict(self, state: MDPState) -> list[float]:
        """The predictor's PREDICTOR_OUTPUTS at ``state``."""
        return self.predictor(state.features()[None])[0].tolist()

    def propose_first(self, step: DraftStepOutput, temperature: float) -> bool:
        accept = self.predict(self.first_state(step, temperature))[0]
        return accept >= self.throughput() * (self.costs.target(2) - self.costs.target(1))

    def decide(self, state: MDPState) -> bool:
        accept, ratio, next_accept, next_ratio = self.predict(state)
        if self.block:
            self.survival = min(1.0, self.survival * ratio * RATIO_CAP)
            gain = min(1.0, self.survival * next_ratio * RATIO_CAP)
        else:
            self.survival *= accept
            gain = self.survival * next_accept
        return self._worth(gain, state.position)

    def observe(self, drafted: int, accepted: float, draft_s: float, target_s: float, rows: int | None = None) -> None:
        super().observe(drafted, accepted, draft_s, target_s, rows)
        a = self.smoothing
        self.costs.update(drafted, draft_s, target_s, rows or 1)
        if rows is not None:
            if drafted:
                alpha = geometric_acceptance(accepted, drafted)
                self.alpha_sum = a * self.alpha_sum + rows * drafted * alpha
                self.alpha_weight = a * self.alpha_weight + rows * drafted
            return
        if draft_s > 0:  # a drafting round, verified or withheld
            value = accepted + 1 - (draft_s + target_s) / self.costs.target(1)
            self.draft_value = a * self.draft_value + (1 - a) * value
        self.tokens = a * self.tokens + (1 - a) * (accepted + 1)
        self.seconds = a * self.seconds + (1 - a) * (draft_s + target_s)


class NetworkPolicy(SpeculativePolicy):
    """CONTINUE iff the network's output is > 0 (a ValueNetwork's value of continuing, or a
    PolicyNetwork's logit of CONTINUE)."""

    def __init__(self, network: ValueNetwork, max_draft_tokens: int = 8):
        super().__init__(max_draft_tokens)
        self.network = network.eval()

    @torch.no_grad()
    def decide(self, state: MDPState) -> bool:
        return float(self.network(state.features()[None])[0]) > 0.0
