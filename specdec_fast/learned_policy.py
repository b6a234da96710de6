"""Learned, cost-aware draft-length policies (DESIGN.md "The MDP"; SpecDec++, Huang et al. 2024).

The objective is long-run tokens per second. With lambda the achievable throughput, each
round maximises E[N - lambda T] (renewal reward / Dinkelbach): after drafting token i with
survival s_i (the predicted probability that tokens 1..i are all accepted), drafting one
more adds s_i a_{i+1} expected tokens for one draft step plus the larger target pass,

    CONTINUE  iff  s_i a_{i+1} >= lambda (c + T(i + 2) - T(i + 1)),

with a_{i+1} predicted from the current token's features, c and T(n) (seconds of a draft
step and of a target pass over n tokens) measured, and lambda the running throughput. The
same test decides whether to draft at all. For block verification s_i is the clipped
cumulative ratio min(1, s_{i-1} rho_i), rho = E[min(R, p/q)].
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .policy import FEATURES, MDPState, SpeculativePolicy

RATIO_CAP = 4.0  # the ratio head predicts E[min(RATIO_CAP, p/q)] / RATIO_CAP
DEFAULT_ARTIFACT = Path(__file__).parent / "data" / "policy.safetensors"


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


class AcceptancePredictor(FeatureMLP):
    """[N, F] features -> [N, 2] in (0, 1): P(accept) = E[min(1, p/q)] of the token just drafted,
    and E[min(RATIO_CAP, p/q)] / RATIO_CAP."""

    def __init__(self, hidden: int = 32):
        super().__init__(2, hidden)

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


class CostModel:
    """Seconds of a draft step (c) and of a target pass over n tokens (T(n)), as exponential moving
    averages of what the loop measures, starting from priors (measured when the policy was trained)."""

    def __init__(self, draft_step_s: float, target_pass_s: dict[int, float], smoothing: float = 0.8):
        self.draft_step_s = draft_step_s
        self.target_pass_s = dict(target_pass_s)
        self.smoothing = smoothing

    def target(self, n: int) -> float:
        """T(n), linear between (and beyond) the pass sizes measured."""
        known = sorted(self.target_pass_s)
        if n in self.target_pass_s:
            return self.target_pass_s[n]
        lo = max([m for m in known if m < n], default=known[0])
        hi = min([m for m in known if m > n], default=known[-1])
        if lo == hi:
            return self.target_pass_s[lo]
        return self.target_pass_s[lo] + (n - lo) * (self.target_pass_s[hi] - self.target_pass_s[lo]) / (hi - lo)

    def update(self, drafted: int, draft_s: float, target_s: float) -> None:
        a = self.smoothing
        if drafted:
            self.draft_step_s = a * self.draft_step_s + (1 - a) * draft_s / drafted
        n = drafted + 1
        self.target_pass_s[n] = a * self.target(n) + (1 - a) * target_s


class CostAwarePolicy(SpeculativePolicy):
    """The learned stopping rule of the module docstring, with an :class:`AcceptancePredictor`.

    ``probe_every``: after that many rounds without drafting, draft one round anyway, so the
    estimate of the first token's acceptance can recover when the text gets easier.
    """

    def __init__(self, predictor: AcceptancePredictor, costs: CostModel, verifier: str = "token",
                 max_draft_tokens: int = 8, probe_every: int = 16):
        super().__init__(max_draft_tokens)
        self.predictor, self.costs, self.block = predictor.eval(), costs, verifier == "block"
        self.probe_every = probe_every
        self.first_acceptance = 0.5  # running acceptance of the first drafted token
        self.tokens, self.seconds = 1.0, costs.target(1)  # running throughput = tokens / seconds
        self.skipped = 0

    def throughput(self) -> float:
        return self.tokens / self.seconds

    def _worth(self, gain: float, drafted: int) -> bool:
        """Is one more draft token (after `drafted`) with expected gain `gain` worth its cost?"""
        cost = self.costs.draft_step_s + self.costs.target(drafted + 2) - self.costs.target(drafted + 1)
        return gain >= self.throughput() * cost

    def begin_round(self, remaining: int) -> int:
        limit = super().begin_round(remaining)
        if limit and (self._worth(self.first_acceptance, 0) or self.skipped >= self.probe_every):
            self.skipped = 0
            return limit
        self.skipped += 1
        return 0

    @torch.no_grad()
    def decide(self, state: MDPState) -> bool:
        accept, ratio = self.predictor(state.features()[None])[0].tolist()
        if self.block:
            self.survival = min(1.0, self.survival * ratio * RATIO_CAP)
        else:
            self.survival *= accept
        return self._worth(self.survival * accept, state.position)

    def observe(self, drafted: int, accepted: int, draft_s: float, target_s: float) -> None:
        super().observe(drafted, accepted, draft_s, target_s)
        a = self.smoothing
        if drafted:
            self.first_acceptance = a * self.first_acceptance + (1 - a) * float(accepted >= 1)
        self.tokens = a * self.tokens + (1 - a) * (accepted + 1)
        self.seconds = a * self.seconds + (1 - a) * (draft_s + target_s)
        self.costs.update(drafted, draft_s, target_s)


class NetworkPolicy(SpeculativePolicy):
    """CONTINUE iff the network's output is > 0 (a ValueNetwork's value of continuing, or a
    PolicyNetwork's logit of CONTINUE)."""

    def __init__(self, network: ValueNetwork, max_draft_tokens: int = 8):
        super().__init__(max_draft_tokens)
        self.network = network.eval()

    @torch.no_grad()
    def decide(self, state: MDPState) -> bool:
        return float(self.network(state.features()[None])[0]) > 0.0


def save_policy(path: Path, predictor: AcceptancePredictor, value: ValueNetwork, policy: PolicyNetwork,
                metadata: dict) -> None:
    """One safetensors file: the three networks' weights, and ``metadata`` (costs, calibration) as JSON."""
    from safetensors.torch import save_file

    tensors = {f"{name}.{key}": t.contiguous() for name, net in (("predictor", predictor), ("value", value),
                                                                   ("policy", policy)) for key, t in net.state_dict().items()}
    save_file(tensors, str(path), metadata={"specdec_fast": json.dumps(metadata)})


def load_policy(path: Path = DEFAULT_ARTIFACT) -> tuple[AcceptancePredictor, ValueNetwork, PolicyNetwork, dict]:
    """The networks and metadata written by :func:`save_policy` (``specdec-fast train-policy``)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        metadata = json.loads(f.metadata()["specdec_fast"])
    nets = AcceptancePredictor(metadata["hidden"]), ValueNetwork(metadata["hidden"]), PolicyNetwork(metadata["hidden"])
    for name, net in zip(("predictor", "value", "policy"), nets):
        net.load_state_dict({key.removeprefix(name + "."): t for key, t in tensors.items() if key.startswith(name + ".")})
    return (*nets, metadata)


def default_policy(verifier: str = "token", path: Path = DEFAULT_ARTIFACT, max_draft_tokens: int = 8) -> CostAwarePolicy:
    """The shipped cost-aware policy (trained on the default SmolLM2 pair), with its measured cost priors."""
    predictor, _, _, metadata = load_policy(path)
    costs = CostModel(metadata["draft_step_s"], {int(n): s for n, s in metadata["target_pass_s"].items()})
    return CostAwarePolicy(predictor, costs, verifier=verifier, max_draft_tokens=max_draft_tokens)
