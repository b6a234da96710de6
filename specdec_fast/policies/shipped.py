"""The learned policies shipped for SmolLM2 (one per draft kind, ``specdec-fast train-policy``
reproduces them): how a policy's networks and cost priors are saved and loaded."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..drafts.binding import draft_kind
from .costs import CostModel
from .learned import PREDICTOR_OUTPUTS, AcceptancePredictor, CostAwarePolicy, PolicyNetwork, ValueNetwork
from .mdp import FEATURES
from .sources import CostAwareSources, cost_aware_sources

# The shipped policies, one per SmolLM2 draft kind (``specdec-fast train-policy --draft KIND``).
POLICY_FILES = {kind: Path(str(resources.files("specdec_fast.data").joinpath(name)))
                for kind, name in (("token", "policy.safetensors"), ("feature", "policy_feature.safetensors"),
                                   ("lookup", "policy_lookup.safetensors"))}


def save_policy(path: Path, predictor: AcceptancePredictor, value: ValueNetwork, policy: PolicyNetwork,
                metadata: dict) -> None:
    """One safetensors file: the three networks' weights, and ``metadata`` (costs, calibration) as JSON."""
    tensors = {f"{name}.{key}": t.contiguous() for name, net in (("predictor", predictor), ("value", value),
                                                                   ("policy", policy)) for key, t in net.state_dict().items()}
    save_file(tensors, str(path), metadata={"specdec_fast": json.dumps(metadata)})


def load_policy(path: Path = POLICY_FILES["token"]) -> tuple[AcceptancePredictor, ValueNetwork, PolicyNetwork, dict]:
    """The networks and metadata written by :func:`save_policy` (``specdec-fast train-policy``)."""
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        metadata = json.loads(f.metadata()["specdec_fast"])
    if metadata.get("features") != list(FEATURES) or metadata.get("outputs") != list(PREDICTOR_OUTPUTS):
        raise ValueError(f"{path} predicts {metadata.get('outputs', ['accept', 'ratio'])} from the features "
                         f"{metadata.get('features')}, this version {list(PREDICTOR_OUTPUTS)} from {list(FEATURES)}: "
                         "retrain it with `specdec-fast train-policy`")
    nets = AcceptancePredictor(metadata["hidden"]), ValueNetwork(metadata["hidden"]), PolicyNetwork(metadata["hidden"])
    for name, net in zip(("predictor", "value", "policy"), nets):
        net.load_state_dict({key.removeprefix(name + "."): t for key, t in tensors.items() if key.startswith(name + ".")})
    return (*nets, metadata)


def default_policy(verifier: str = "token", path: Path | None = None, max_draft_tokens: int = 8,
                   draft=None) -> CostAwarePolicy:
    """A shipped cost-aware policy with its measured cost priors: the one trained for ``draft``'s kind
    (a feature draft: the feature pair's, the main job's; any other: the token pair's), or the one
    in ``path``; with neither, the token pair's. Its ``trained_for`` names the draft kind it learnt
    from, and the loops warn when it meets another."""
    kind = draft_kind(draft) if draft is not None else "token"
    path = path if path is not None else POLICY_FILES[kind if kind == "feature" else "token"]
    predictor, _, _, metadata = load_policy(path)
    costs = CostModel(metadata["draft_step_s"], {int(n): s for n, s in metadata["target_pass_s"].items()})
    policy = CostAwarePolicy(predictor, costs, verifier=verifier, max_draft_tokens=max_draft_tokens)
    policy.trained_for = metadata.get("draft", "token")
    return policy


def default_sources(path: Path | None = None) -> CostAwareSources:
    """The shipped source chooser of a :class:`~specdec_fast.drafts.hybrid.Hybrid` (``specdec-fast
    train-policy --draft lookup`` reproduces it), or the one in ``path``."""
    return cost_aware_sources(path if path is not None else POLICY_FILES["lookup"])
