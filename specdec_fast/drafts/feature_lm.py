"""The feature draft and its target as caches for the decoding loops.

Both models join the unchanged decoding loop as :class:`~specdec_fast.models.cached_lm.CachedLM`
objects bound to each other by :func:`feature_pair`: :class:`FeatureTargetLM` records the
target's hidden state at every cached position, and :class:`FeatureDraftLM` takes the
target's features where the target has computed them and its own elsewhere. A draft
position computed from its own features is dropped at the next rollback and recomputed
from the target's (the loop re-feeds it), so the draft's cache only ever holds positions
computed from true features. :class:`BatchedFeatureTarget` and :class:`BatchedFeatureDraft`
do the same for a batch. Losslessness does not depend on any of this: the verifier only
needs the draft probabilities it was given.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from ..models.batched_lm import BatchedLM
from ..models.cached_lm import HFCachedLM, TransformersLM
from ..models.lean import BatchedLeanLM, LeanLM, LeanPass, lean_precision, lean_unsupported
from .feature import FeatureDraft

DRAFT_PRECISION = "int8"  # the lean feature draft's weights: a draft may change its outputs (verification stays exact)


class FeatureTargetLM(HFCachedLM):
    """:class:`HFCachedLM` that also keeps the target's final hidden state of every cached
    position (``features`` [cache_length, d])."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.features = torch.zeros(0, model.config.hidden_size, device=self.device)

    def reset(self) -> None:
        super().reset()
        self.features = self.features[:0]

    @torch.inference_mode()
    def _forward(self, tokens: Tensor, num_logits: int, **mask) -> Tensor:
        hidden = self.model.model(input_ids=tokens.to(self.device)[None], use_cache=True, **mask,
                                  **{self._cache_arg: self.cache}).last_hidden_state[0]
        self.features = torch.cat([self.features, hidden.float()])  # crop keeps it at cache_length rows
        return self.model.lm_head(hidden[-num_logits:])

    @torch.inference_mode()
    def keep_sibling(self, length: int, slot: int) -> None:
        self.features[length - 1] = self.features[slot]
        super().keep_sibling(length, slot)

    def crop(self, length: int) -> None:
        super().crop(length)
        self.features = self.features[:length]


class FeatureDraftLM(TransformersLM):
    """:class:`CachedLM` over a :class:`FeatureDraft` reading ``target``'s features, its layers run
    by transformers (:class:`LeanFeatureDraftLM`: on the lean path)."""

    def __init__(self, draft: FeatureDraft, target: FeatureTargetLM | LeanLM):
        super().__init__(draft.lm)
        self.draft = draft.eval()
        self.target = target
        self.vocab_size = target.vocab_size
        self.reset()

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self._clear()
        self.true_length = 0  # leading positions computed from the target's own features
        self.last_feature = None  # the draft's predicted feature of its last cached position

    def _previous_features(self, start: int, n: int) -> tuple[Tensor, bool]:
        """Features of positions start-1 .. start+n-2 and whether they are all the target's."""
        known = self.target.features
        if start + n - 1 <= len(known):
            head = torch.zeros(1, known.shape[1], device=known.device) if start == 0 else known[start - 1 : start]
            return torch.cat([head, known[start : start + n - 1]]), True
        if n == 1 and self.last_feature is not None:
            return self.last_feature[None], False
        raise ValueError(f"the target's features of positions {len(known)}..{start + n - 2} are not known: "
                         "feed the draft one token at a time beyond the target's cache")

    @torch.inference_mode()
    def extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        start, n = self.cache_length, len(tokens)
        prev, true = self._previous_features(start, n)
        feats, logits = self._layers(tokens.to(self.device), prev, num_logits)
        if true and self.true_length == start:
            self.true_length = start + n
        self.last_feature = feats[-1]
        return logits

    def _layers(self, tokens: Tensor, prev: Tensor, num_logits: int) -> tuple[Tensor, Tensor]:
        """Append ``tokens`` [n] (``prev`` [n, d]: the features of the positions before them) to the
        cache; returns (their predicted features [n, d], the logits [num_logits, V] of the last
        ``num_logits``)."""
        feats = self.draft.features(tokens[None], prev[None], use_cache=True, **{self._cache_arg: self.cache})[0]
        return feats, self.draft.lm.lm_head(feats[-num_logits:])

    def crop(self, length: int) -> None:
        if length > self.cache_length:
            raise ValueError(f"cannot crop a cache of {self.cache_length} tokens to {length}")
        keep = min(length, self.true_length)  # positions drafted from own features are recomputed
        if keep < self.cache_length:
            self._truncate(keep)
            self.last_feature = None
        self.true_length = keep

    def _clear(self) -> None:
        self.cache = DynamicCache(config=self.draft.lm.config)

    def _truncate(self, length: int) -> None:
        self.cache.crop(length - self.cache_length)


class LeanFeatureDraftLM(FeatureDraftLM):
    """:class:`FeatureDraftLM` whose layers and head run as one op of the lean path
    (:class:`~specdec_fast.models.lean.LeanPass`, weights at ``precision``); the draft's fc and
    embedding lookup stay torch ops. A step costs ~0.5 ms on the shipped draft (int8) instead of
    transformers' ~1.3 ms."""

    def __init__(self, draft: FeatureDraft, target: FeatureTargetLM | LeanLM, precision: str = DRAFT_PRECISION):
        self.lean = LeanPass(draft.lm, 1, precision)
        super().__init__(draft, target)

    @property
    def cache_length(self) -> int:
        return self.length

    def _clear(self) -> None:
        self.length = 0

    def _layers(self, tokens: Tensor, prev: Tensor, num_logits: int) -> tuple[Tensor, Tensor]:
        start, n = self.length, len(tokens)
        positions = torch.arange(start, start + n, device=self.device)
        small = self.lean.run(self.draft.inputs(tokens[None], prev[None])[0], torch.zeros_like(positions), positions,
                              torch.arange(n - num_logits, n, device=self.device))
        self.length += n  # the features are copied: their cache slots are written again after a rollback
        return self.lean.features[0, start : start + n].clone(), self.draft.lm.lm_head.widen(small)

    def _truncate(self, length: int) -> None:
        self.length = length


class BatchedFeatureTarget(BatchedLM):
    """:class:`~specdec_fast.batch.BatchedLM` over the target that also keeps its final hidden
    state of every slot (``features`` [B, slots, d], aligned with ``valid``)."""

    def __init__(self, model: nn.Module, batch: int):
        super().__init__(model, batch)
        self.features = torch.zeros(batch, 0, model.config.hidden_size, device=self.device)

    @torch.inference_mode()
    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        hidden = self.model.model(input_ids=tokens.to(self.device), **self._append(fed)).last_hidden_state
        self.features = torch.cat([self.features, hidden.float()], 1)
        return self.model.lm_head(hidden[:, -num_logits:])

    def keep(self, lengths: Tensor) -> None:
        super().keep(lengths)
        self.features = self.features[:, : self.valid.shape[1]]

    def select(self, rows: Tensor) -> None:
        super().select(rows)
        self.features = self.features[rows.to(self.device)]


class BatchedFeatureDraft(BatchedLM):
    """:class:`~specdec_fast.batch.BatchedLM` over a :class:`FeatureDraft` reading ``target``'s
    features, as :class:`FeatureDraftLM` does for one sequence: a row's own predicted feature
    stands in beyond the target's cache (one token at a time), and ``keep`` drops the positions
    computed from it (the next round re-feeds them)."""

    def __init__(self, draft: FeatureDraft, target: BatchedFeatureTarget | BatchedLeanLM, batch: int):
        super().__init__(draft.lm, batch)
        self.draft = draft.eval()
        self.target = target
        self.vocab_size = target.vocab_size
        self.true_lengths = torch.zeros(batch, dtype=torch.int64, device=self.device)  # tokens from true features
        self.last_feature = None  # [B, d]: the draft's predicted feature of each row's last slot

    def _previous_features(self, positions: Tensor, fed: Tensor) -> tuple[Tensor, Tensor]:
        """For each fed slot at sequence position t, the feature of position t - 1 ([B, n, d]; zeros
        before a row's first token), and [B] bool: the row used its own last feature."""
        target = self.target
        wanted = positions - 1
        beyond = fed & (wanted >= target.lengths[:, None])  # positions the target has not computed
        own = beyond.any(1)
        allowed = (fed.sum(1) == 1) & (self.last_feature is not None)
        if bool((own & ~allowed).any()):
            row = int((own & ~allowed).nonzero()[0])
            raise ValueError(f"row {row}: the target's features of positions {int(target.lengths[row])}.."
                             f"{int(wanted[row][fed[row]][-1])} are not known: feed the draft one token at a time "
                             "beyond the target's cache")
        slot = torch.zeros_like(target.valid, dtype=torch.int64)  # slot[b, p]: the slot of row b's position p
        rows, slots = target.valid.nonzero(as_tuple=True)
        slot[rows, target.valid.cumsum(1)[rows, slots] - 1] = slots
        prev = torch.zeros(*fed.shape, target.features.shape[-1], device=self.device)
        b, j = (fed & ~beyond & (wanted >= 0)).nonzero(as_tuple=True)
        prev[b, j] = target.features[b, slot[b, wanted[b, j]]]
        b, j = beyond.nonzero(as_tuple=True)
        if len(b):
            prev[b, j] = self.last_feature[b]
        return prev, own

    @torch.inference_mode()
    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        fed, before = fed.to(self.device), self.lengths
        prev, own = self._previous_features(self._positions(fed), fed)  # checks before the cache changes
        inputs = self._append(fed)
        feats = self.draft.features(tokens.to(self.device), prev, **inputs)
        self.true_lengths = torch.where(~own & (self.true_lengths == before), self.lengths, self.true_lengths)
        self.last_feature = feats[:, -1]
        return self.draft.lm.lm_head(feats[:, -num_logits:])

    def keep(self, lengths: Tensor) -> None:
        self.true_lengths = torch.minimum(self.true_lengths, lengths.to(self.device))
        super().keep(self.true_lengths)
        self.last_feature = None

    def select(self, rows: Tensor) -> None:
        super().select(rows)
        self.true_lengths = self.true_lengths[rows.to(self.device)]
        self.last_feature = None if self.last_feature is None else self.last_feature[rows.to(self.device)]


def feature_pair(target: nn.Module, draft: FeatureDraft, lean: str = "auto") -> tuple[FeatureTargetLM | LeanLM, FeatureDraftLM]:
    """The (target, draft) pair to pass to :func:`~specdec_fast.generate.fast_generate`: the target
    on the lean path where :func:`~specdec_fast.models.lean.lean_precision` allows (it keeps its
    features too), else a :class:`FeatureTargetLM`; the draft on the lean path beside a lean target
    where its layers can take it (:class:`LeanFeatureDraftLM`), else by transformers.

    The two objects share state (the target's features): use them together, for one
    generation at a time."""
    precision = lean_precision(target, lean)
    if not precision:
        target_lm = FeatureTargetLM(target)
        return target_lm, FeatureDraftLM(draft, target_lm)
    target_lm = LeanLM(target, precision)
    lean_draft = lean_unsupported(draft.lm) is None
    return target_lm, (LeanFeatureDraftLM if lean_draft else FeatureDraftLM)(draft, target_lm)
