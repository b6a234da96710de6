"""The one place that binds a draft to its target: what the decoding loops call to turn the
``(target, draft)`` a user passes into the caches they run on.

A transformers model becomes a cache of its own (:func:`~specdec_fast.models.cached_lm.as_cached_lm`,
:class:`~specdec_fast.models.batched_lm.BatchedLM`); a :class:`~specdec_fast.drafts.feature.FeatureDraft`
is bound to the target whose hidden states it reads (:mod:`specdec_fast.drafts.feature_lm`).
"""

from __future__ import annotations

from torch import nn

from ..models.batched_lm import BatchedCachedLM, BatchedLM, OneSequence
from ..models.cached_lm import CachedLM, as_cached_lm
from ..models.lean import BatchedLeanLM, cached_lm, lean_precision
from .feature import FeatureDraft
from .feature_lm import BatchedFeatureDraft, BatchedFeatureTarget, FeatureDraftLM, feature_pair
from .hybrid import Hybrid, HybridLM
from .lookup import LookupLM, PromptLookup


def draft_kind(draft) -> str:
    """"feature" for a feature draft (the module or its caches), "lookup" for prompt lookup,
    "token" for any other draft; a hybrid is the kind of its model (the rounds a policy decides)."""
    if isinstance(draft, (PromptLookup, LookupLM)):
        return "lookup"
    if isinstance(draft, Hybrid):
        return draft_kind(draft.model)
    if isinstance(draft, HybridLM):  # a cache of one sequence wraps its model's
        return draft_kind(draft.model.lm if isinstance(draft.model, OneSequence) else draft.model)
    return "feature" if isinstance(draft, (FeatureDraft, FeatureDraftLM, BatchedFeatureDraft)) else "token"


def check_pair(target_lm, draft_lm) -> None:
    """Target and draft must share the vocabulary and (where they say) the device."""
    if target_lm.vocab_size != draft_lm.vocab_size:
        raise ValueError(f"vocabulary mismatch: target has {target_lm.vocab_size} logits, draft has {draft_lm.vocab_size}")
    devices = getattr(target_lm, "device", None), getattr(draft_lm, "device", None)
    if None not in devices and devices[0] != devices[1]:
        raise ValueError(f"device mismatch: target is on {devices[0]}, draft on {devices[1]}")


def lookup_pair(target_lm, draft: PromptLookup, batch: int):
    """(``target_lm``, the :class:`LookupLM` of ``draft`` for ``batch`` rows on its vocabulary and device)."""
    return target_lm, LookupLM(draft, target_lm.vocab_size, batch, target_lm.max_length, getattr(target_lm, "device", "cpu"))


def cached_pair(target, draft, lean: str = "auto") -> tuple[CachedLM, CachedLM]:
    """The (target, draft) caches of one sequence: the target as :func:`~specdec_fast.models.lean.cached_lm`
    makes it (the lean path unless ``lean`` says otherwise), the draft as :func:`as_cached_lm` does;
    for a :class:`FeatureDraft` draft, the bound pair of :func:`feature_pair`. Checked with
    :func:`check_pair`."""
    if isinstance(draft, Hybrid):
        target_lm, model_lm = cached_pair(target, draft.model, lean)
        target_lm, lookup_lm = lookup_pair(target_lm, draft.lookup, 1)
        pair = target_lm, HybridLM(OneSequence(model_lm), lookup_lm, draft.min_match, draft.chooser)
    elif isinstance(draft, FeatureDraft):
        pair = feature_pair(target, draft, lean)
    elif isinstance(draft, PromptLookup):
        pair = lookup_pair(cached_lm(target, lean), draft, 1)
    else:
        pair = cached_lm(target, lean), as_cached_lm(draft)
    check_pair(*pair)
    return pair


def batched_pair(target: nn.Module, draft: nn.Module | None, batch: int,
                 lean: str = "auto") -> tuple[BatchedCachedLM, BatchedCachedLM | None]:
    """The batch caches of ``target`` (:class:`~specdec_fast.models.lean.BatchedLeanLM` where
    :func:`~specdec_fast.models.lean.lean_precision` allows, else :class:`BatchedLM`) and ``draft``
    (a transformers causal LM, a :class:`FeatureDraft` of this target, or None for no draft).
    Checked with :func:`check_pair`."""
    if isinstance(draft, Hybrid):
        target_lm, model_lm = batched_pair(target, draft.model, batch, lean)
        target_lm, lookup_lm = lookup_pair(target_lm, draft.lookup, batch)
        return target_lm, HybridLM(model_lm, lookup_lm, draft.min_match, draft.chooser)
    precision = lean_precision(target, lean)
    if precision:
        target_lm = BatchedLeanLM(target, batch, precision)
    else:
        target_lm = BatchedFeatureTarget(target, batch) if isinstance(draft, FeatureDraft) else BatchedLM(target, batch)
    if isinstance(draft, FeatureDraft):
        pair = target_lm, BatchedFeatureDraft(draft, target_lm, batch)
    elif isinstance(draft, PromptLookup):
        pair = lookup_pair(target_lm, draft, batch)
    else:
        pair = target_lm, BatchedLM(draft, batch) if draft is not None else None
    if pair[1] is not None:
        check_pair(*pair)
    return pair
