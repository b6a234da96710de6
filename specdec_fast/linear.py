"""Skinny linear layers for CPU verification passes (``use_skinny_linear``).

A verification pass feeds the target k + 1 tokens. On the CPU, BLAS computes such a
skinny product x [M, K] @ w^T as M matrix-vector products (or packs w first), reading the
weights several times; a 2-token pass measured 1.7x, a 5-token pass 1.6-2.1x, a one-token
pass of SmolLM2-135M here, which alone makes speculation lose. The ``cpu`` backend's
``skinny_linear`` kernel (csrc/cpu/skinny_linear.h) reads the weights once for up to 12
rows (beyond that BLAS is as fast), and sums every output in the same order whatever the number of rows, so a token's
logits do not depend on how many tokens share the pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backends import resolve

MAX_ROWS = 12  # csrc/cpu/skinny_linear.h allows 16; at 16 rows BLAS is as fast


def skinny_linear(x: Tensor, weight: Tensor, backend: str = "auto") -> Tensor:
    """x [M, K] fp32 @ weight [N, K]^T -> [M, N] fp32 for 1 <= M <= 12: the ``cpu`` kernel, or
    F.linear for ``backend="torch"`` (the reference) and where the kernel cannot load."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"skinny_linear needs x [M, K] and weight [N, K], got {list(x.shape)} and {list(weight.shape)}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"skinny_linear is fp32 only, got {x.dtype} and {weight.dtype}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"skinny_linear takes 1..{MAX_ROWS} rows, got {x.shape[0]}")
    if resolve(backend, x.device) == "cpu":
        return torch.ops.specdec_fast.skinny_linear(x, weight)
    return F.linear(x, weight)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(x, weight)`` (x [..., K], weight [N, K]), by the skinny kernel where it applies:
    fp32 CPU tensors, at most 12 rows, no autograd, and the ``cpu`` backend loads."""
    rows = x.numel() // weight.shape[1] if weight.shape[1] else 0
    if (1 <= rows <= MAX_ROWS and x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_grad_enabled() and resolve("auto", x.device) == "cpu"):
        return torch.ops.specdec_fast.skinny_linear(x.reshape(rows, -1), weight).reshape(*x.shape[:-1], -1)
    return F.linear(x, weight)


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
