"""Draft policies: the MDP of speculative decoding (state, protocol, baselines), the learned
cost-aware policy and its cost model, the shipped policies, and measured pass costs. A policy
chooses how many tokens to draft, never which are accepted."""

from .baselines import ConfidenceThreshold, EntropyStop, FixedDraftLength, HeuristicSchedule
from .learned import AcceptancePredictor, CostAwarePolicy, PolicyNetwork, ValueNetwork
from .mdp import DraftPolicy, MDPState, SpeculativePolicy
from .shipped import default_policy

__all__ = ["AcceptancePredictor", "ConfidenceThreshold", "CostAwarePolicy", "DraftPolicy", "EntropyStop",
           "FixedDraftLength", "HeuristicSchedule", "MDPState", "PolicyNetwork", "SpeculativePolicy", "ValueNetwork",
           "default_policy"]
