"""Draft policies: the MDP of speculative decoding (state, protocol, baselines), the learned
cost-aware policy and its cost model, the hybrid's source chooser, the shipped policies, and
measured pass costs. A policy chooses how many tokens to draft and from which source, never
which are accepted."""

from .baselines import ConfidenceThreshold, EntropyStop, FixedDraftLength, HeuristicSchedule
from .learned import AcceptancePredictor, CostAwarePolicy, PolicyNetwork, ValueNetwork
from .mdp import DraftPolicy, MDPState, SpeculativePolicy
from .shipped import default_policy, default_sources
from .sources import CostAwareSources, LookupAcceptance

__all__ = ["AcceptancePredictor", "ConfidenceThreshold", "CostAwarePolicy", "CostAwareSources", "DraftPolicy",
           "EntropyStop", "FixedDraftLength", "HeuristicSchedule", "LookupAcceptance", "MDPState", "PolicyNetwork",
           "SpeculativePolicy", "ValueNetwork", "default_policy", "default_sources"]
