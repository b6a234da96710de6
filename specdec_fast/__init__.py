"""specdec_fast: lossless speculative decoding for PyTorch causal LMs."""

from .attention import use_packed_gqa
from .backends import backends
from .batch import BatchGenerationOutput, batch_generate
from .bench.efficiency import EfficiencyBenchmark
from .cached_lm import CachedLM, HFCachedLM, as_cached_lm
from .decoder import ProductionSpeculativeDecoder, SpeculativeDecoder
from .feature_draft import FeatureDraft, feature_pair
from .generate import GenerationOutput, GenerationStats, fast_generate, generate_autoregressive, warmup
from .ops import DraftStepOutput, VerifyOutput, draft_step, philox_uniforms, verify
from .monitoring import AdaptiveMonitoringSystem
from .linear import skinny_linear, skinny_linear_int8, use_int8_weights, use_skinny_linear
from .learned_policy import AcceptancePredictor, CostAwarePolicy, PolicyNetwork, ValueNetwork, default_policy
from .policy import (ConfidenceThreshold, DraftPolicy, EntropyStop, FixedDraftLength, HeuristicSchedule, MDPState,
                     SpeculativePolicy)
from .sampling import SamplingParams, warp_logits
from .smollm2 import load_feature_models, load_feature_pair, load_smollm2, use_fast_passes

__version__ = "0.1.0"

__all__ = [
    "AdaptiveMonitoringSystem",
    "AcceptancePredictor",
    "BatchGenerationOutput",
    "batch_generate",
    "ConfidenceThreshold",
    "EfficiencyBenchmark",
    "CostAwarePolicy",
    "EntropyStop",
    "FeatureDraft",
    "feature_pair",
    "load_feature_models",
    "load_feature_pair",
    "HeuristicSchedule",
    "MDPState",
    "PolicyNetwork",
    "SpeculativePolicy",
    "ValueNetwork",
    "default_policy",
    "backends",
    "CachedLM",
    "DraftPolicy",
    "DraftStepOutput",
    "FixedDraftLength",
    "GenerationOutput",
    "GenerationStats",
    "HFCachedLM",
    "SamplingParams",
    "SpeculativeDecoder",
    "ProductionSpeculativeDecoder",
    "VerifyOutput",
    "as_cached_lm",
    "draft_step",
    "fast_generate",
    "generate_autoregressive",
    "load_smollm2",
    "philox_uniforms",
    "verify",
    "skinny_linear",
    "skinny_linear_int8",
    "use_int8_weights",
    "use_skinny_linear",
    "use_packed_gqa",
    "use_fast_passes",
    "warmup",
    "warp_logits",
]
