"""A transformers causal LM with one KV cache for a batch of sequences of different lengths.

Each slot (cache position) of row b is either valid (a token of b's sequence) or a hole: left
padding, the filler of a row that fed fewer tokens than the others, or a rejected draft
token. Holes are masked out of attention and skipped by the position ids, so each row's logits
are those of its own sequence. Rolling back by a different amount per row turns slots into
holes; slots that no row uses any more are cropped off the end; rows that finish leave.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from transformers import DynamicCache

from .cached_lm import CachedLM, TransformersLM, is_transformers_lm


@runtime_checkable
class BatchedCachedLM(Protocol):
    """What the decoding round needs of a model: a KV cache for B sequences.

    lengths: [B] int64, tokens of each row in the cache.
    extend(tokens [B, n] int64, fed [B, n] bool, num_logits): append one slot per column (False:
        a hole the row does not see) and return the logits [B, num_logits, V] of the last slots.
    keep(lengths [B]): keep the first lengths[b] tokens of row b (at most what it holds).
    select(rows [B'] int64): keep only these rows of the batch.
    """

    vocab_size: int
    max_length: int | None

    @property
    def lengths(self) -> Tensor: ...

    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor: ...

    def keep(self, lengths: Tensor) -> None: ...

    def select(self, rows: Tensor) -> None: ...


class BatchedLM(TransformersLM):
    """A transformers causal LM with one ``DynamicCache`` for B sequences of different lengths.

    ``valid`` [B, slots] bool marks the slots that hold a token of the row's sequence.
    """

    def __init__(self, model: torch.nn.Module, batch: int):
        if not is_transformers_lm(model):
            raise TypeError(f"{type(model).__name__} is not a transformers causal LM (batch_generate needs one)")
        super().__init__(model)
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)

    @property
    def lengths(self) -> Tensor:
        """[B] int64: tokens of each row in the cache."""
        return self.valid.sum(1)

    @torch.inference_mode()
    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        """Append one slot per column: ``tokens`` [B, n] int64, ``fed`` [B, n] bool (False: a hole).

        Returns the logits [B, num_logits, V] of the last ``num_logits`` slots.
        """
        inputs = self._append(fed)
        return self.model(input_ids=tokens.to(self.device), logits_to_keep=num_logits, **inputs).logits

    def _positions(self, fed: Tensor) -> Tensor:
        """[B, n] int64: the sequence positions of the slots one ``extend`` would add (``fed`` [B, n] bool, on the device)."""
        return (self.lengths[:, None] + fed.cumsum(1) - 1).clamp(min=0)

    def _append(self, fed: Tensor) -> dict:
        """Add the slots of one ``extend`` (``fed`` [B, n] bool) and return the model's keyword
        arguments for them: the mask over all slots, the new slots' position ids [B, n], the cache."""
        fed = fed.to(self.device)
        positions = self._positions(fed)
        self.valid = torch.cat([self.valid, fed], 1)
        return dict(attention_mask=self.valid.long(), position_ids=positions, use_cache=True, **{self._cache_arg: self.cache})

    def keep(self, lengths: Tensor) -> None:
        """Keep the first ``lengths[b]`` tokens of row b ([B] int64); drop the slots no row uses."""
        self.valid = self.valid & (self.valid.cumsum(1) <= lengths.to(self.device)[:, None])
        used = self.valid.any(0).nonzero()
        end = int(used[-1]) + 1 if len(used) else 0
        if end < self.valid.shape[1]:
            self.cache.crop(end - self.valid.shape[1])
            self.valid = self.valid[:, :end]

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` ([B'] int64 indices) of the batch."""
        self.cache.batch_select_indices(rows.to(self.device))
        self.valid = self.valid[rows.to(self.device)]


class OneSequence:
    """A :class:`CachedLM` of one sequence as a :class:`BatchedCachedLM` of one row, so that one
    sequence runs through the same decoding round as a batch. ``lm`` is the wrapped model."""

    def __init__(self, lm: CachedLM):
        self.lm = lm
        self.vocab_size, self.max_length = lm.vocab_size, lm.max_length

    @property
    def lengths(self) -> Tensor:
        return torch.tensor([self.lm.cache_length])

    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        """tokens [1, n], fed [1, n] (a row of one sequence has no holes) -> logits [1, num_logits, V]."""
        return self.lm.extend(tokens[0], num_logits)[None]

    def keep(self, lengths: Tensor) -> None:
        self.lm.crop(min(self.lm.cache_length, int(lengths[0])))

    def select(self, rows: Tensor) -> None:
        """Nothing to do: the one row either stays or finishes the generation."""

    def reset(self) -> None:
        self.lm.reset()


def right_aligned(seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Rows of different lengths as tokens [B, width] int64 and fed [B, width] bool, holes on the left."""
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.int64)
    fed = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        if s:
            tokens[b, width - len(s):] = torch.tensor(s)
            fed[b, width - len(s):] = True
    return tokens, fed
