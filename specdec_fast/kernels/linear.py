"""Skinny linear ops for CPU verification passes (the modules that use them: models/fast_passes.py).

A verification pass feeds the target k + 1 tokens. On the CPU, BLAS computes such a
skinny product x [M, K] @ w^T as M matrix-vector products (or packs w first), reading the
weights several times; a 2-token pass measured 1.7x, a 5-token pass 1.6-2.1x, a one-token
pass of SmolLM2-135M here, which alone makes speculation lose. The ``cpu`` backend's
``skinny_linear`` kernel (csrc/cpu/skinny_linear.h) reads the weights once, in tiles of up to 6
rows by 4 weight rows (the public op takes up to 12 rows; the decoder pass any number), and sums
every output in the same order whatever the number of rows, so a token's logits do not depend on
how many tokens share the pass.

A draft may also read int8 weights (``use_int8_weights``: one fp32 scale per output row,
``skinny_linear_int8``), a quarter of the bytes of a draft pass; the target never does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import registry  # noqa: F401  the skinny ops' schemas
from .backends import resolve

MAX_ROWS = 12  # csrc/cpu/skinny_linear.h allows 16; at 16 rows BLAS is as fast


def _check_rows(name: str, x: Tensor, weight: Tensor, scale: Tensor | None = None) -> None:
    """The shapes the public skinny ops take: x [M, K] with 1 <= M <= 12, weight [N, K] (and scale [N])."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or (scale is not None and scale.shape != weight.shape[:1]):
        wanted = "x [M, K] and weight [N, K]" + (" and scale [N]" if scale is not None else "")
        got = " and ".join(str(list(t.shape)) for t in (x, weight, scale) if t is not None)
        raise ValueError(f"{name} needs {wanted}, got {got}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"{name} takes 1..{MAX_ROWS} rows, got {x.shape[0]}")


def skinny_linear(x: Tensor, weight: Tensor, backend: str = "auto") -> Tensor:
    """x [M, K] fp32 @ weight [N, K]^T -> [M, N] fp32 for 1 <= M <= 12: the ``cpu`` kernel, or
    F.linear for ``backend="torch"`` (the reference) and where the kernel cannot load."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"skinny_linear is fp32 only, got {x.dtype} and {weight.dtype}")
    _check_rows("skinny_linear", x, weight)
    if resolve(backend, x.device) == "cpu":
        return torch.ops.specdec_fast.skinny_linear(x, weight)
    return F.linear(x, weight)


def _kernel_rows(x: Tensor, in_features: int) -> int:
    """Rows of ``x`` for the skinny kernel, or 0 where it does not apply: fp32 CPU tensors,
    at most 12 rows, no autograd, and the ``cpu`` backend loads."""
    rows = x.numel() // in_features if in_features else 0
    usable = (1 <= rows <= MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu"
              and not torch.is_grad_enabled() and resolve("auto", x.device) == "cpu")
    return rows if usable else 0


def _on_rows(op, x: Tensor, rows: int, *args: Tensor) -> Tensor:
    """``op(x as [rows, K], *args)`` reshaped back to x's leading dimensions."""
    return op(x.reshape(rows, -1), *args).reshape(*x.shape[:-1], -1)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(x, weight)`` (x [..., K], weight [N, K]), by the skinny kernel where it applies
    (see :func:`_kernel_rows`; the weight fp32 too)."""
    rows = _kernel_rows(x, weight.shape[1])
    if rows and weight.dtype == torch.float32:
        return _on_rows(torch.ops.specdec_fast.skinny_linear, x, rows, weight)
    return F.linear(x, weight)


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] float -> (int8 [N, K], scale [N] fp32): symmetric, one scale per output
    row (its largest magnitude / 127), weight ~= int8 * scale[:, None]."""
    scale = weight.detach().float().abs().amax(1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    return torch.round(weight.detach().float() / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def skinny_linear_int8(x: Tensor, weight: Tensor, scale: Tensor, backend: str = "auto") -> Tensor:
    """x [M, K] fp32 @ (weight [N, K] int8 * scale [N, 1] fp32)^T -> [M, N] fp32 for 1 <= M <= 12:
    the ``cpu`` kernel, or the reference :func:`dequantized_linear` for ``backend="torch"``
    and where the kernel cannot load."""
    if x.dtype != torch.float32 or weight.dtype != torch.int8 or scale.dtype != torch.float32:
        raise ValueError(f"skinny_linear_int8 takes fp32 x, int8 weight, fp32 scale, got {x.dtype}, {weight.dtype}, {scale.dtype}")
    _check_rows("skinny_linear_int8", x, weight, scale)
    if resolve(backend, x.device) == "cpu":
        return torch.ops.specdec_fast.skinny_linear_int8(x, weight, scale)
    return dequantized_linear(x, weight, scale)


def dequantized_linear(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """The int8 reference: ``F.linear(x, weight) * scale`` in x's dtype (x [..., K], weight [N, K]
    int8, scale [N]) -> [..., N]."""
    return F.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)


def linear_int8(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """:func:`dequantized_linear` (x [..., K] fp32, weight [N, K] int8, scale [N] fp32), by the int8
    skinny kernel where it applies (see :func:`_kernel_rows`)."""
    rows = _kernel_rows(x, weight.shape[1])
    if rows:
        return _on_rows(torch.ops.specdec_fast.skinny_linear_int8, x, rows, weight, scale)
    return dequantized_linear(x, weight, scale)
