"""Drafts: small and early-exit draft models, the feature (EAGLE-like) draft and its caches, the
binding of a draft to its target, and the drafts shipped for SmolLM2."""

from .binding import batched_pair, cached_pair, check_pair
from .feature import FeatureDraft
from .feature_lm import feature_pair
from .shipped import load_feature_models, load_feature_pair, load_pair, load_token_pair
from .small import early_exit_draft

__all__ = ["FeatureDraft", "batched_pair", "cached_pair", "check_pair", "early_exit_draft", "feature_pair",
           "load_feature_models", "load_feature_pair", "load_pair", "load_token_pair"]
