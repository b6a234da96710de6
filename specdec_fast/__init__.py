"""specdec_fast: lossless speculative decoding for PyTorch causal LMs.

The core API is here. Everything else is imported from its subpackage: ``kernels`` (the ops
and backends), ``models``, ``drafts``, ``policies``, ``decoding``, ``training``, ``bench``.
``import specdec_fast`` loads no training, benchmark or monitoring code; the names that lived
here before (the seed's ``AdaptiveMonitoringSystem`` and ``EfficiencyBenchmark`` among them)
still import from here, loaded from their subpackage on first use.
"""

from importlib import import_module

from .decoding import (
    BatchGenerationOutput,
    GenerationOutput,
    GenerationStats,
    ProductionSpeculativeDecoder,
    SpeculativeDecoder,
    batch_generate,
    fast_generate,
    generate_autoregressive,
    warmup,
)
from .decoding.requests import chat_prompt_ids
from .drafts import FeatureDraft, load_feature_models
from .kernels import SamplingParams, draft_step, verify
from .models import CachedLM, load_smollm2
from .policies import FixedDraftLength, MDPState, SpeculativePolicy, default_policy

__version__ = "0.1.0"

__all__ = [
    "BatchGenerationOutput", "CachedLM", "FeatureDraft", "FixedDraftLength", "GenerationOutput", "GenerationStats",
    "MDPState", "ProductionSpeculativeDecoder", "SamplingParams", "SpeculativeDecoder", "SpeculativePolicy",
    "batch_generate", "chat_prompt_ids", "default_policy", "draft_step", "fast_generate", "generate_autoregressive",
    "load_feature_models", "load_smollm2", "verify", "warmup",
]

# Names outside the core API, by the module that holds them.
_ELSEWHERE = {
    "specdec_fast.kernels": ("DraftStepOutput", "VerifyOutput", "backends", "philox_uniforms", "skinny_linear",
                             "skinny_linear_int8", "warp_logits"),
    "specdec_fast.models": ("HFCachedLM", "as_cached_lm", "use_fast_passes", "use_int8_weights", "use_packed_gqa",
                            "use_skinny_linear"),
    "specdec_fast.drafts": ("Hybrid", "LookupCorpus", "PromptLookup", "feature_pair", "load_feature_pair"),
    "specdec_fast.policies": ("AcceptancePredictor", "ConfidenceThreshold", "CostAwarePolicy", "DraftPolicy", "EntropyStop",
                              "HeuristicSchedule", "PolicyNetwork", "ValueNetwork"),
    "specdec_fast.policies.monitoring": ("AdaptiveMonitoringSystem",),
    "specdec_fast.bench.efficiency": ("EfficiencyBenchmark",),
}
_MODULE_OF = {name: module for module, names in _ELSEWHERE.items() for name in names}


def __getattr__(name: str):
    """``specdec_fast.X`` for a name outside the core API: loaded from its module on first use."""
    if name in _MODULE_OF:
        return getattr(import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'specdec_fast' has no attribute {name!r}")
