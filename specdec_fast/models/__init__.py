"""Models as the decoding loops see them: the ``CachedLM`` protocol and its transformers adapter,
the batched cache, packed grouped-query attention, the in-place fast-pass swaps, and the offline
SmolLM2 loader."""

from .attention import use_packed_gqa
from .batched_lm import BatchedLM
from .cached_lm import CachedLM, HFCachedLM, as_cached_lm
from .fast_passes import use_fast_passes, use_int8_weights, use_skinny_linear
from .smollm2 import load_smollm2

__all__ = ["BatchedLM", "CachedLM", "HFCachedLM", "as_cached_lm", "load_smollm2", "use_fast_passes", "use_int8_weights",
           "use_packed_gqa", "use_skinny_linear"]
