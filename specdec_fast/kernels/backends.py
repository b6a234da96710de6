"""The backend choice: which implementation of an op runs on a tensor's device.

``backend="auto"`` takes, for CPU tensors, ``cpu``; for CUDA tensors, ``cuda`` then ``triton``;
one that cannot build or load falls back to the next with one warning that says why, and
finally to ``torch`` (the reference). A backend named explicitly that cannot run raises.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable

import torch

from . import registry  # noqa: F401  defines the op schemas before any backend registers an implementation
from .build import load_cpu, load_cuda, load_triton

LOADERS: dict[str, Callable[[], None]] = {"cpu": load_cpu, "cuda": load_cuda, "triton": load_triton}
AUTO_ORDER = {"cpu": ("cpu",), "cuda": ("cuda", "triton")}  # fastest first, per tensor device


def _devices(name: str) -> tuple[str, ...]:
    """Tensor devices a backend runs on (Triton runs CPU tensors under TRITON_INTERPRET=1 only)."""
    if name == "triton":
        return ("cuda", "cpu") if os.environ.get("TRITON_INTERPRET") == "1" else ("cuda",)
    return {"torch": ("cpu", "cuda"), "cpu": ("cpu",), "cuda": ("cuda",)}[name]


def unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run here, or None if it can (loads it, building on first call)."""
    try:
        LOADERS[name]()
        return None
    except RuntimeError as error:
        return str(error)


def backends() -> dict[str, str | None]:
    """Every backend and why it cannot run here (None if it can). Builds kernels on first call."""
    return {"torch": None} | {name: unavailable(name) for name in LOADERS}


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def resolve(backend: str, device: torch.device) -> str:
    """The backend to run on ``device``: ``auto`` takes the fastest that loads (falling back
    with one warning that says why); an explicitly named backend that cannot run raises."""
    if backend == "auto":
        for name in AUTO_ORDER.get(device.type, ()):
            try:
                LOADERS[name]()
                return name
            except RuntimeError as error:
                _warn_once(f"specdec_fast: {name} kernels unavailable, using the next backend ({error})")
        return "torch"
    if backend not in ("torch", *LOADERS):
        raise ValueError(f"unknown backend {backend!r}; choose from {('auto', 'torch', *LOADERS)}")
    if device.type not in _devices(backend):
        raise ValueError(f"backend {backend!r} does not run on {device.type} tensors")
    if backend in LOADERS:
        LOADERS[backend]()
    return backend
