"""A causal LM with its own KV cache: the only interface the decoding loop needs.

Any model can join the loop by implementing :class:`CachedLM` (four members);
transformers causal LMs are wrapped by :class:`HFCachedLM`. One object holds the cache
of one sequence. Rolling back after a rejection is ``crop``: the rejected positions are
dropped, nothing is recomputed. First-token alternatives (``fast_generate(num_alternatives=)``)
also need ``extend_siblings`` and ``keep_sibling`` on the target, which :class:`HFCachedLM` has.
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from transformers import DynamicCache

from .attention import NAME as PACKED_GQA


@runtime_checkable
class CachedLM(Protocol):
    """Minimal protocol for a KV-cached causal LM of one sequence.

    vocab_size: V, the size of the logits' last dimension.
    max_length: the longest sequence the model supports (None if unbounded).
    cache_length: tokens currently held in the cache.
    reset(): empty the cache.
    extend(tokens [n] int64, num_logits): append ``tokens`` to the cache and return the
        logits [num_logits, V] of the last ``num_logits`` of them (1 <= num_logits <= n);
        row i predicts the token after tokens[n - num_logits + i].
    crop(length): keep the first ``length`` cached tokens, drop the rest.
    """

    vocab_size: int
    max_length: int | None

    @property
    def cache_length(self) -> int: ...

    def reset(self) -> None: ...

    def extend(self, tokens: Tensor, num_logits: int) -> Tensor: ...

    def crop(self, length: int) -> None: ...


def is_transformers_lm(model) -> bool:
    return hasattr(model, "config") and hasattr(model, "get_output_embeddings")


def cache_argument(model: torch.nn.Module) -> str:
    """The name of a transformers model's cache argument: transformers renamed
    ``past_key_values`` to ``cache`` (5.2x); accept either."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class TransformersLM:
    """What both cache adapters read off a transformers causal LM: the model (in eval mode),
    ``vocab_size``, ``max_length``, ``device``, its ``generation_config`` (the defaults of a
    generation) and the name of its cache argument."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()
        self.generation_config = getattr(model, "generation_config", None)
        self.vocab_size = int(model.get_output_embeddings().out_features)
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.device = next(model.parameters()).device
        self._cache_arg = cache_argument(model)


class HFCachedLM(TransformersLM):
    """:class:`CachedLM` over a transformers causal LM with a ``DynamicCache`` (batch of one)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self._new_cache = lambda: DynamicCache(config=model.config)
        self.cache = self._new_cache()

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = self._new_cache()

    def extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        return self._forward(tokens, num_logits)

    @torch.inference_mode()
    def _forward(self, tokens: Tensor, num_logits: int, **mask) -> Tensor:
        """One pass over ``tokens`` [n] (``mask``: optional attention_mask and position_ids);
        returns the logits [num_logits, V] of the last ``num_logits`` of them."""
        out = self.model(
            input_ids=tokens.to(self.device)[None],
            use_cache=True,
            logits_to_keep=num_logits,
            **mask,
            **{self._cache_arg: self.cache},
        )
        return out.logits[0]

    def extend_siblings(self, tokens: Tensor, siblings: Tensor, at: int, num_logits: int) -> Tensor:
        """Append ``tokens`` [n] as :meth:`extend` does, then ``siblings`` [a]: alternatives to
        tokens[at], each seeing the cache and tokens[:at] only, at tokens[at]'s position.
        Returns logits [num_logits + a, V]: the last ``num_logits`` of ``tokens``, then one row
        per sibling (the token after it). :meth:`keep_sibling` or :meth:`crop` follows."""
        attention = self.model.config._attn_implementation
        if attention not in SIBLING_ATTENTION:
            raise ValueError(f"sibling passes need attention with a 4D mask ({', '.join(sorted(SIBLING_ATTENTION))}); "
                             f"this model uses {attention!r}")
        start, n, a = self.cache_length, len(tokens), len(siblings)
        mask = sibling_mask(start, n, a, at, self.device)
        # Additive, in the model's dtype: eager attention adds the mask to the scores, sdpa takes either form.
        dtype = next(self.model.parameters()).dtype
        mask["attention_mask"] = torch.zeros((), dtype=dtype, device=self.device).masked_fill(
            ~mask["attention_mask"], torch.finfo(dtype).min)
        return self._forward(torch.cat([tokens, siblings.to(tokens.device)]), num_logits + a, **mask)

    @torch.inference_mode()
    def keep_sibling(self, length: int, slot: int) -> None:
        """Keep the first ``length - 1`` cached tokens and, as the last, the one cached at ``slot``
        (a sibling that :meth:`extend_siblings` appended at position ``length - 1``)."""
        for layer in self.cache.layers:
            layer.keys[:, :, length - 1] = layer.keys[:, :, slot]
            layer.values[:, :, length - 1] = layer.values[:, :, slot]
        self.crop(length)

    def crop(self, length: int) -> None:
        drop = self.cache_length - length
        if drop < 0:
            raise ValueError(f"cannot crop a cache of {self.cache_length} tokens to {length}")
        if drop:
            self.cache.crop(-drop)


SIBLING_ATTENTION = {"eager", "sdpa", PACKED_GQA}  # attention implementations that take a 4D mask


def sibling_mask(start: int, n: int, a: int, at: int, device) -> dict[str, Tensor]:
    """attention_mask [1, 1, n + a, start + n + a] (bool, True = attend) and position_ids [1, n + a]
    for a pass over n causal tokens after ``start`` cached ones, then ``a`` siblings of token ``at``:
    sibling j sees the cache, tokens[:at] and itself, at position start + at."""
    q = n + a
    mask = torch.ones(q, q, dtype=torch.bool, device=device).tril()
    mask[n:, at:n] = False
    mask[n:, n:] = torch.eye(a, dtype=torch.bool, device=device)
    mask = torch.cat([torch.ones(q, start, dtype=torch.bool, device=device), mask], 1)
    positions = torch.cat([torch.arange(start, start + n), torch.full((a,), start + at)]).to(device)
    return dict(attention_mask=mask[None, None], position_ids=positions[None])


def as_cached_lm(model) -> CachedLM:
    """Return ``model`` if it already implements :class:`CachedLM`, else wrap a transformers model."""
    if isinstance(model, CachedLM):
        return model
    if is_transformers_lm(model):
        return HFCachedLM(model)
    raise TypeError(
        f"{type(model).__name__} is neither a transformers causal LM nor a CachedLM "
        "(vocab_size, max_length, cache_length, reset(), extend(tokens, num_logits), crop(length))"
    )
