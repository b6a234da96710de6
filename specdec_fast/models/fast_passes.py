"""The in-place fast-pass swaps of a transformers model: skinny linear layers, int8 draft
weights, and packed grouped-query attention (:func:`use_fast_passes` applies the two that keep
a model's outputs: every loader of this project applies it to both models of a pair).

A verification pass feeds the target k + 1 tokens; on a CPU, BLAS computes such a skinny
product as k + 1 matrix-vector products and reads the weights several times. The ``cpu``
backend's ``skinny_linear`` op (specdec_fast/kernels/linear.py) reads them once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..kernels.linear import linear, linear_int8, quantize_int8
from .attention import use_packed_gqa


class Int8Linear(nn.Module):
    """A bias-free linear layer with int8 weights and an fp32 scale per output row
    (:func:`quantize_int8`): x [..., in_features] fp32 -> [..., out_features], by the int8
    skinny kernel where it applies, else by dequantizing."""

    def __init__(self, weight: Tensor):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        int8, scale = quantize_int8(weight)
        self.register_buffer("weight", int8)
        self.register_buffer("scale", scale)

    def forward(self, x: Tensor) -> Tensor:
        return linear_int8(x, self.weight, self.scale)


class SkinnyLinear(nn.Linear):
    """An ``nn.Linear`` without bias whose forward is :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight)


def use_skinny_linear(model: nn.Module) -> nn.Module:
    """Switch, in place, every fp32 CPU ``nn.Linear`` without bias of ``model`` to :class:`SkinnyLinear`
    (same weights, parameters and module tree); returns ``model``."""
    for module in model.modules():
        if (type(module) is nn.Linear and module.bias is None and module.weight.dtype == torch.float32
                and module.weight.device.type == "cpu"):
            module.__class__ = SkinnyLinear
    return model


def use_int8_weights(draft: nn.Module) -> nn.Module:
    """Quantize a draft's weights to int8 in place (weight-only, :class:`Int8Linear`): every fp32
    CPU ``nn.Linear`` without bias, and the modules that quantize themselves
    (``quantize_int8()``: the drafts' restricted heads); returns ``draft``.

    For drafts only: it changes the model's outputs, which a draft may do (verification
    stays exact for any draft distribution) and a target may not."""
    for parent in list(draft.modules()):
        for name, child in parent.named_children():
            if (isinstance(child, nn.Linear) and child.bias is None and child.weight.dtype == torch.float32
                    and child.weight.device.type == "cpu"):
                setattr(parent, name, Int8Linear(child.weight))
    for module in draft.modules():
        if hasattr(module, "quantize_int8"):
            module.quantize_int8()
    return draft


def use_fast_passes(model: nn.Module) -> nn.Module:
    """The CPU verification-pass speed-ups, in place: skinny linear layers
    (:func:`use_skinny_linear`) and packed grouped-query attention
    (:func:`~specdec_fast.models.attention.use_packed_gqa`). Returns ``model``."""
    return use_packed_gqa(use_skinny_linear(model))
