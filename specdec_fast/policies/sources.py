"""Choosing the draft source each round: look up, draft with the model, and how many tokens.

A :class:`~specdec_fast.drafts.hybrid.Hybrid` asks its ``chooser`` at the start of every round,
for each sequence, whether to copy the lookup's proposal (and how many of its tokens) or to let
the model draft (whose policy then picks the length, zero included: no speculation). The
baseline rule (the Hybrid without a chooser) looks up when the match has at least
``min_match`` tokens. :class:`CostAwareSources` is the learned, cost-aware version:

- :class:`LookupAcceptance` predicts, from features of the lookup (LOOKUP_FEATURES: the
  matched suffix length, the position in the proposal, the temperature, how often this
  sequence's lookups were accepted so far, and how many tokens the match offers), the
  probability that the i-th proposed token is accepted given the ones before it were. It is
  fitted by ``specdec-fast train-policy --draft lookup`` to the exact acceptance probabilities
  p_i(X_i) of traced proposals (a point mass is accepted with the target's probability).
- A lookup of L tokens is then worth (1 + sum_{i<=L} prod_{j<=i} a_j) / T(L + 1) tokens per
  second, T the seconds of a round verifying L + 1 tokens (a CostModel whose priors are the
  measured pass plus the measured per-round overhead, updated from the lookup rounds it times);
  the best L is compared with the running tokens per second of the sequence's model rounds
  (measured from the rounds themselves), or before any, with the calibrated rate of plain rounds
  (:meth:`CostAwareSources.use_calibration`; uncalibrated, a sequence's first round drafts with the
  model, so that there is a rate to compare with).

The chooser sees the committed context and earlier rounds only, never the target's output of
the round it decides, so the output law is the target's whatever it chooses.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .calibration import Calibration
from .costs import CostModel

LOOKUP_FEATURES = ("matched", "position", "temperature", "recent_acceptance", "offered")
PRIOR_ACCEPTANCE = 0.5  # a sequence's lookup acceptance before its first lookup round


class LookupAcceptance(nn.Module):
    """P(lookup token i accepted | tokens before it accepted) from LOOKUP_FEATURES [N, F] -> [N];
    a small MLP on standardised features (mean / std buffers set by the fit)."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.register_buffer("mean", torch.zeros(len(LOOKUP_FEATURES)))
        self.register_buffer("std", torch.ones(len(LOOKUP_FEATURES)))
        self.net = nn.Sequential(nn.Linear(len(LOOKUP_FEATURES), hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.hidden = hidden

    def logits(self, features: Tensor) -> Tensor:
        return self.net((features - self.mean) / self.std).squeeze(-1)

    def forward(self, features: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(features))


def lookup_features(matched: float, offered: int, temperature: float, recent: float, length: int) -> Tensor:
    """The LOOKUP_FEATURES rows [length, F] of positions 1..length of one proposal."""
    positions = torch.arange(1, length + 1, dtype=torch.float32)
    other = torch.tensor([matched, temperature, recent, offered], dtype=torch.float32).expand(length, 4)
    return torch.cat([other[:, :1], positions[:, None], other[:, 1:]], 1)


def expected_accepted(acceptance: Tensor) -> Tensor:
    """[L] per-position acceptance -> [L] expected accepted tokens of proposals cut at 1..L."""
    return acceptance.cumprod(0).cumsum(0)


class CostAwareSources:
    """The learned, cost-aware source choice of the module docstring, for B sequences.

    ``choose(matched, offered, temperature)`` -> (looked_up [B] bool, lengths [B]) at the start of
    a round; ``observe(accepted)`` after it (accepted drafts per row). Rounds are timed between
    the two calls. ``smoothing``: the weight of the past in the running rates and acceptances.
    """

    def __init__(self, acceptance: LookupAcceptance, costs: CostModel, smoothing: float = 0.8):
        self.acceptance, self.costs, self.smoothing = acceptance.eval(), costs, smoothing
        self.plain_rate: float | None = None  # tokens per second of plain rounds, as calibrated
        self.calibrated: dict | None = None
        self.reset(1)

    def use_calibration(self, calibration: Calibration | None) -> None:
        """Weigh lookups by the costs measured where the loop runs, against plain rounds until a row's
        model rounds are timed (once per calibration: what was learnt since is kept)."""
        if calibration is None or calibration.key == self.calibrated:
            return
        self.calibrated, self.costs = calibration.key, calibration.cost_model()
        self.plain_rate = 1.0 / calibration.plain_round_s

    def reset(self, batch: int) -> None:
        """Forget the sequences' histories (a new generation of ``batch`` rows)."""
        self.recent = [PRIOR_ACCEPTANCE] * batch  # per row: accepted / drafted of its lookup rounds
        self.model_rate: list[float | None] = [None] * batch  # per row: tokens per second of its model rounds
        self.pending = None

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` of the batch."""
        self.recent = [self.recent[b] for b in rows]
        self.model_rate = [self.model_rate[b] for b in rows]

    @torch.no_grad()
    def lookup_plan(self, matched: int, offered: int, temperature: float, recent: float) -> tuple[int, float]:
        """(the best lookup length L in 1..offered, its expected tokens per second)."""
        a = self.acceptance(lookup_features(matched, offered, temperature, recent, offered))
        rates = (1.0 + expected_accepted(a)) / torch.tensor([self.costs.target(n + 1) for n in range(1, offered + 1)])
        best = int(rates.argmax())
        return best + 1, float(rates[best])

    def choose(self, matched: Tensor, offered: Tensor, temperature: Tensor) -> tuple[Tensor, Tensor]:
        """Per row: look up (with the length that maximises its expected rate) where that rate beats
        the row's model rounds (or the plain pass, before any), else the model."""
        looked_up = torch.zeros(len(matched), dtype=torch.bool)
        lengths = torch.zeros(len(matched), dtype=torch.int64)
        for b, (m, c, t) in enumerate(zip(matched.tolist(), offered.tolist(), temperature.tolist())):
            if c <= 0 or m <= 0:
                continue
            baseline = self.model_rate[b] if self.model_rate[b] is not None else self.plain_rate
            if baseline is None:  # not calibrated: the row's first rounds draft with the model, whose rate is measured first
                continue
            length, rate = self.lookup_plan(m, c, t, self.recent[b])
            if rate > baseline:
                looked_up[b], lengths[b] = True, length
        self.pending = (looked_up, lengths, time.perf_counter())
        return looked_up, lengths

    def observe(self, accepted: Tensor) -> None:
        """The round chosen last ended with ``accepted`` [B] drafts accepted per row."""
        if self.pending is None:
            return
        looked_up, lengths, start = self.pending
        seconds, a = time.perf_counter() - start, self.smoothing
        self.pending = None
        for b, (used, n, k) in enumerate(zip(looked_up.tolist(), lengths.tolist(), accepted.tolist())):
            if used:
                self.recent[b] = a * self.recent[b] + (1 - a) * k / max(n, 1)
                self.costs.update(n, 0.0, seconds)
            else:
                rate = (k + 1) / seconds
                self.model_rate[b] = rate if self.model_rate[b] is None else a * self.model_rate[b] + (1 - a) * rate


def save_lookup_acceptance(path: Path, net: LookupAcceptance, metadata: dict) -> None:
    """One safetensors file: the network, and ``metadata`` (target pass costs, the fit) as JSON."""
    save_file({k: t.contiguous() for k, t in net.state_dict().items()}, str(path),
              metadata={"specdec_fast": json.dumps(metadata | {"features": list(LOOKUP_FEATURES), "hidden": net.hidden})})


def load_lookup_acceptance(path: Path) -> tuple[LookupAcceptance, dict]:
    with safe_open(str(path), "pt") as f:
        metadata = json.loads(f.metadata()["specdec_fast"])
    if metadata.get("features") != list(LOOKUP_FEATURES):
        raise ValueError(f"{path} predicts from {metadata.get('features')}, this version from {list(LOOKUP_FEATURES)}: "
                         "retrain it with `specdec-fast train-policy --draft lookup`")
    net = LookupAcceptance(metadata["hidden"])
    net.load_state_dict(load_file(str(path)))
    return net, metadata


def cost_aware_sources(path: Path) -> CostAwareSources:
    """A :class:`CostAwareSources` from a file of ``train-policy --draft lookup`` (its acceptance
    network and measured target pass costs)."""
    net, metadata = load_lookup_acceptance(path)
    costs = CostModel(metadata["draft_step_s"], {int(n): s for n, s in metadata["target_pass_s"].items()})
    return CostAwareSources(net, costs)
