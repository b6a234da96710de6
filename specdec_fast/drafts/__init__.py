"""Drafts: small and early-exit draft models, the feature (EAGLE-like) draft and its caches, prompt
lookup (copying from the context and a corpus) and the hybrid of a lookup and a model, the
binding of a draft to its target, and the drafts shipped for SmolLM2."""

from .binding import batched_pair, cached_pair, check_pair
from .feature import FeatureDraft
from .feature_lm import feature_pair
from .hybrid import Hybrid
from .lookup import LookupCorpus, PromptLookup
from .shipped import load_feature_models, load_feature_pair, load_pair, load_token_pair
from .small import early_exit_draft

__all__ = ["FeatureDraft", "Hybrid", "LookupCorpus", "PromptLookup", "batched_pair", "cached_pair", "check_pair", "early_exit_draft", "feature_pair",
           "load_feature_models", "load_feature_pair", "load_pair", "load_token_pair"]
