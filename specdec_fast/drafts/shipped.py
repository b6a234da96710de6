"""The drafts shipped for SmolLM2-135M-Instruct (in ``specdec_fast/data``, each with its card;
``specdec-fast train-draft`` reproduces them) and the loaders of the pairs they make."""

from __future__ import annotations

from importlib import resources

import torch

from ..models.cached_lm import CachedLM
from ..models.fast_passes import use_fast_passes
from ..models.smollm2 import load_smollm2
from .feature import FeatureDraft, load_feature_draft
from .feature_lm import feature_pair
from .small import load_small_draft

TOKEN_DRAFT_FILE = "smollm2_draft.safetensors"
FEATURE_DRAFT_FILE = "smollm2_feature_draft.safetensors"
DRAFT_KINDS = ("feature", "token")  # the shipped drafts; the first is the main job's


def shipped_file(name: str):
    """Path of a file shipped in specdec_fast/data."""
    path = resources.files("specdec_fast.data").joinpath(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reproduce it with `specdec-fast train-draft`")
    return path


def default_draft(target: torch.nn.Module) -> torch.nn.Module:
    """The distilled token-level draft shipped for SmolLM2-135M-Instruct (card: specdec_fast/data/smollm2_draft.md)."""
    return load_small_draft(target, shipped_file(TOKEN_DRAFT_FILE))


def default_feature_draft(target: torch.nn.Module) -> FeatureDraft:
    """The feature draft shipped for SmolLM2-135M-Instruct (card: specdec_fast/data/smollm2_feature_draft.md)."""
    return load_feature_draft(target, shipped_file(FEATURE_DRAFT_FILE))


def load_token_pair() -> tuple[torch.nn.Module, torch.nn.Module, object]:
    """SmolLM2-135M-Instruct and the shipped token-level draft, both transformers models (fp32, CPU,
    :func:`~specdec_fast.models.fast_passes.use_fast_passes`), for every path that needs models
    (batch_generate, transformers' assisted generation). Returns (target, draft, tokenizer)."""
    target, tokenizer = load_smollm2()
    draft = default_draft(target)
    return use_fast_passes(target), use_fast_passes(draft), tokenizer


def load_feature_models() -> tuple[torch.nn.Module, FeatureDraft, object]:
    """SmolLM2-135M-Instruct (a transformers model) and the shipped :class:`FeatureDraft` built on
    it (both with fast passes, fp32, CPU). Returns (target, draft, tokenizer), to pass to
    ``fast_generate`` or ``batch_generate``."""
    target, tokenizer = load_smollm2()
    draft = use_fast_passes(default_feature_draft(target))
    return use_fast_passes(target), draft, tokenizer


def load_feature_pair() -> tuple[CachedLM, CachedLM, object]:
    """:func:`load_feature_models` as the bound pair of :func:`~specdec_fast.drafts.feature_lm.feature_pair`.
    Returns (target_lm, draft_lm, tokenizer), to pass to ``fast_generate``."""
    target, draft, tokenizer = load_feature_models()
    return (*feature_pair(target, draft), tokenizer)


def load_pair(draft: str, models: bool = False):
    """The SmolLM2 pair with the shipped draft of kind ``draft`` ("feature": :func:`load_feature_pair`,
    the main job's, or :func:`load_feature_models` if ``models``; "token": :func:`load_token_pair`).
    Returns (target, draft, tokenizer)."""
    loaders = {"feature": load_feature_models if models else load_feature_pair, "token": load_token_pair}
    if draft not in loaders:
        raise ValueError(f"draft must be one of {sorted(loaders)}, got {draft!r}")
    return loaders[draft]()
