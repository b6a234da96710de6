"""Small draft models for a target: early exit (the target's first layers) and small
transformers LMs in the target's architecture with a head restricted to a token subset, and
how their weights are saved (only the draft's own: the embeddings stay the target's)."""

from __future__ import annotations

import copy

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from ..kernels.linear import linear
from ..models.fast_passes import Int8Linear


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


class RestrictedHead(torch.nn.Module):
    """An LM head over a subset of the vocabulary; every other token gets logit -inf.

    q = 0 outside the subset keeps verification lossless: such tokens are never drafted
    and the residual max(0, p - q) gives them their full target probability.

    Shape: hidden [..., d] -> logits [..., out_features]; ``restricted`` gives [..., N].
    """

    def __init__(self, weight: torch.Tensor, vocab_ids: torch.Tensor, out_features: int):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)  # [N, d]
        self.register_buffer("vocab_ids", vocab_ids.long())  # [N] full-vocabulary id of each row
        self.out_features = out_features
        self.int8 = None  # an Int8Linear of the weight, after quantize_int8()

    def quantize_int8(self) -> None:
        """Compute the head with int8 weights from now on (:func:`~specdec_fast.models.fast_passes.use_int8_weights`)."""
        self.int8 = Int8Linear(self.weight)

    def restricted(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.int8(hidden) if self.int8 is not None else linear(hidden, self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.widen(self.restricted(hidden))

    def widen(self, small: torch.Tensor) -> torch.Tensor:
        """Logits over the subset [..., N] -> over the vocabulary [..., out_features] (-inf elsewhere)."""
        full = small.new_full((*small.shape[:-1], self.out_features), float("-inf"))
        return full.index_copy_(-1, self.vocab_ids, small)


def build_small_draft(target: torch.nn.Module, layer_ids: list[int], vocab_ids: torch.Tensor) -> torch.nn.Module:
    """A draft in the target's own architecture: ``len(layer_ids)`` decoder layers initialised
    from those target layers, the target's final norm, the target's input embeddings
    (shared, not copied) and a :class:`RestrictedHead` over ``vocab_ids`` initialised from
    the target's LM head rows. The result is a regular transformers causal LM."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layer_ids)
    config.tie_word_embeddings = False
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layer_ids]
    draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
    draft.model.embed_tokens = target.get_input_embeddings()
    for i, source in enumerate(layer_ids):
        draft.model.layers[i].load_state_dict(target.model.layers[source].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    head = target.get_output_embeddings().weight.detach()[vocab_ids].clone()
    draft.lm_head = RestrictedHead(head, vocab_ids, config.vocab_size)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def own_state(draft: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The draft's own weights: everything but the embeddings it shares with the target."""
    return {k: v for k, v in draft.state_dict().items() if "embed_tokens." not in k}


def save_draft_weights(draft: torch.nn.Module, path, metadata: dict[str, str]) -> None:
    """Write the draft's own weights (fp16) and ``metadata`` to a safetensors file."""
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in own_state(draft).items()}
    save_file(state, str(path), metadata=metadata)


def read_draft_file(path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, weights) of a file written by :func:`save_draft_weights`."""
    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def load_draft_weights(draft: torch.nn.Module, state: dict[str, torch.Tensor], path) -> torch.nn.Module:
    """Load ``state`` (read from ``path``) into ``draft``'s own weights; returns the draft in eval mode."""
    own = own_state(draft)
    missing = set(own) - set(state)
    if missing:
        raise ValueError(f"{path} lacks the weights {sorted(missing)[:5]}")
    draft.load_state_dict({k: state[k].to(own[k].dtype) for k in own}, strict=False)
    return draft.eval()


def save_small_draft(draft: torch.nn.Module, path, metadata: dict[str, str]) -> None:
    """Write the draft's own weights (fp16) and ``metadata`` to a safetensors file."""
    save_draft_weights(draft, path, {"num_layers": str(draft.config.num_hidden_layers), **metadata})


def load_small_draft(target: torch.nn.Module, path) -> torch.nn.Module:
    """Rebuild a draft saved by :func:`save_small_draft` around ``target`` (whose embeddings it shares)."""
    metadata, state = read_draft_file(path)
    draft = build_small_draft(target, list(range(int(metadata["num_layers"]))), state["lm_head.vocab_ids"])
    return load_draft_weights(draft, state, path)
