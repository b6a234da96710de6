"""Draft models for a target."""

from __future__ import annotations

import copy

import torch


def _shallow_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object sharing parameters, with its own child table to replace children in."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def early_exit_draft(target: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """The target's first ``num_layers`` decoder layers with its final norm and LM head
    (self-speculation, sharing the target's weights; no memory is copied).

    Works for transformers decoder-only models that keep their layers in ``model.layers``.
    A model not trained for early exit agrees with itself poorly (SmolLM2: acceptance ~0.01).
    """
    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is None:
        raise TypeError(f"{type(target).__name__} has no model.layers to cut")
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers must be in [1, {len(layers)}], got {num_layers}")
    draft = _shallow_copy(target)
    draft.model = _shallow_copy(target.model)
    draft.model.layers = torch.nn.ModuleList(list(layers)[:num_layers])
    draft.config = copy.deepcopy(target.config)
    draft.config.num_hidden_layers = num_layers
    draft.model.config = draft.config
    return draft.eval()
