"""Kernel backends: just-in-time builds, availability, and the choice made by ``backend="auto"``.

Each backend registers the ops ``torch.ops.specdec_fast.verify`` and ``draft_step`` for
its device. Builds go through ``torch.utils.cpp_extension`` (ninja) into the user cache
folder, are reused until a source changes, and can be disabled with
``SPECDEC_FAST_NO_JIT=1``.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from .smollm2 import cache_root

CSRC = Path(__file__).resolve().parents[1] / "csrc"


@functools.cache
def _load_cpu() -> None:
    """Build (first time) and load the CPU C++ kernels; raises RuntimeError with the reason on failure."""
    if os.environ.get("SPECDEC_FAST_NO_JIT"):
        raise RuntimeError("JIT builds are disabled by SPECDEC_FAST_NO_JIT")
    sources = [CSRC / "cpu" / "ops.cpp"]
    if not all(s.is_file() for s in sources):
        raise RuntimeError(f"kernel sources not found under {CSRC} (install from a source checkout with pip install -e .)")
    from torch.utils.cpp_extension import load

    build = cache_root() / "build" / "cpu"
    flags = ["-O3"]
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):  # ATen's SIMD types need the macro
        flags += ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]
    build.mkdir(parents=True, exist_ok=True)
    try:
        load(name="specdec_fast_cpu", sources=[str(s) for s in sources], extra_cflags=flags,
             build_directory=str(build), is_python_module=False, verbose=bool(os.environ.get("SPECDEC_FAST_VERBOSE")))
    except Exception as error:  # a compiler or ninja failure: report it as the reason
        raise RuntimeError(f"building the CPU kernels failed: {error}") from error
    _register_fakes()


def _register_fakes() -> None:
    """Shapes of the ops' outputs, so they trace under torch.compile (fake tensors)."""

    @torch.library.register_fake("specdec_fast::verify")
    def _(target_logits, draft_probs, draft_tokens, draft_lens, temperature, top_k, top_p, uniforms):
        batch, k_plus_1 = target_logits.shape[:2]
        longs = dict(dtype=torch.int64, device=target_logits.device)
        return (target_logits.new_empty(batch, **longs), target_logits.new_empty(batch, k_plus_1, **longs),
                target_logits.new_empty(batch, **longs))

    @torch.library.register_fake("specdec_fast::draft_step")
    def _(logits, temperature, top_k, top_p, uniforms):
        batch, vocab = logits.shape
        f32 = dict(dtype=torch.float32, device=logits.device)
        return (logits.new_empty(batch, dtype=torch.int64), logits.new_empty(batch, vocab, **f32),
                logits.new_empty(batch, **f32), logits.new_empty(batch, **f32), logits.new_empty(batch, **f32))


LOADERS = {"cpu": _load_cpu}
DEVICES = {"torch": ("cpu", "cuda"), "cpu": ("cpu",)}


def backends() -> dict[str, str | None]:
    """Every backend and why it cannot run here (None if it can). Builds kernels on first call."""
    status: dict[str, str | None] = {"torch": None}
    for name, load in LOADERS.items():
        try:
            load()
            status[name] = None
        except RuntimeError as error:
            status[name] = str(error)
    return status


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def resolve(backend: str, device: torch.device) -> str:
    """The backend to run on ``device``: ``auto`` takes the fastest that loads (falling back
    with one warning that says why); an explicitly named backend that cannot run raises."""
    if backend == "auto":
        for name in ("cpu",):
            if device.type in DEVICES[name]:
                try:
                    LOADERS[name]()
                    return name
                except RuntimeError as error:
                    _warn_once(f"specdec_fast: {name} kernels unavailable, using the torch reference ({error})")
        return "torch"
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}; choose from {('auto',) + tuple(DEVICES)}")
    if device.type not in DEVICES[backend]:
        raise ValueError(f"backend {backend!r} does not run on {device.type} tensors")
    if backend in LOADERS:
        LOADERS[backend]()
    return backend
