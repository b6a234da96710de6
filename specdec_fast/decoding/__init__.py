"""Decoding loops: one round (draft, verify, commit) shared by the single-sequence loop
(``fast_generate``) and the batch loop (``batch_generate``), the autoregressive baseline,
first-token alternatives, warm-up, and the decoder classes."""

from .autoregressive import generate_autoregressive
from .batch import batch_generate
from .decoders import ProductionSpeculativeDecoder, SpeculativeDecoder
from .outputs import BatchGenerationOutput, GenerationOutput, GenerationStats
from .speculative import fast_generate
from .warmup import warmup

__all__ = ["BatchGenerationOutput", "GenerationOutput", "GenerationStats", "ProductionSpeculativeDecoder",
           "SpeculativeDecoder", "batch_generate", "fast_generate", "generate_autoregressive", "warmup"]
