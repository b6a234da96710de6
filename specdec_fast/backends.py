"""Kernel backends: the op schemas, just-in-time builds, availability, and the choice made by ``backend="auto"``.

Ops (``torch.ops.specdec_fast.*``, schemas defined here once, fake implementations for
``torch.compile``): ``verify`` (token-wise), ``verify_block``, ``draft_step`` and
``philox_uniforms``, implemented for CPU tensors by ``csrc/cpu`` and for CUDA tensors by
``csrc/cuda`` (the dispatcher routes by device); ``triton_verify``, ``triton_verify_block``,
``triton_draft_step`` and ``triton_philox_uniforms`` by ``triton_kernels/``. C++ builds go through ``torch.utils.cpp_extension`` (ninja) into the
user cache folder and are reused until a source changes. Environment switches:
``SPECDEC_FAST_NO_JIT=1`` disables builds, ``SPECDEC_FAST_VERBOSE=1`` shows them,
``SPECDEC_FAST_CUDA_ARCH`` sets the CUDA architectures (default: the GPU's, or 9.0).
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Callable

import torch

from .reference import draft_step_reference, verify_block_reference, verify_reference
from .sampling import philox_uniforms
from .smollm2 import cache_root

PACKAGE = Path(__file__).resolve().parent
# Kernel sources: installed inside the package (setup.py copies them), or the source checkout's.
CSRC = PACKAGE / "csrc" if (PACKAGE / "csrc").is_dir() else PACKAGE.parent / "csrc"

VERIFY_SCHEMA = ("(Tensor target_logits, Tensor draft_probs, Tensor draft_tokens, Tensor draft_lens, "
                 "Tensor temperature, Tensor top_k, Tensor top_p, Tensor uniforms) -> (Tensor, Tensor, Tensor)")
SCHEMAS = {
    "verify": VERIFY_SCHEMA,  # token-wise
    "verify_block": VERIFY_SCHEMA,  # block verification
    "draft_step": "(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor uniforms) "
                  "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "philox_uniforms": "(Tensor seed, Tensor offset, int n) -> Tensor",
}
_LIBRARY = torch.library.Library("specdec_fast", "DEF")  # kept alive: it owns the schemas
for _name, _schema in SCHEMAS.items():
    for _prefix in ("", "triton_"):
        _LIBRARY.define(_prefix + _name + _schema)


_LIBRARY.define("skinny_linear(Tensor x, Tensor weight) -> Tensor")  # CPU only (specdec_fast/linear.py)
_LIBRARY.define("skinny_linear_int8(Tensor x, Tensor weight, Tensor scale) -> Tensor")


def _fake_verify(target_logits, draft_probs, draft_tokens, draft_lens, temperature, top_k, top_p, uniforms):
    batch, k_plus_1 = target_logits.shape[:2]
    longs = dict(dtype=torch.int64, device=target_logits.device)
    return torch.empty(batch, **longs), torch.empty(batch, k_plus_1, **longs), torch.empty(batch, **longs)


def _fake_draft_step(logits, temperature, top_k, top_p, uniforms):
    batch, vocab = logits.shape
    f32 = dict(dtype=torch.float32, device=logits.device)
    return (torch.empty(batch, dtype=torch.int64, device=logits.device), torch.empty(batch, vocab, **f32),
            torch.empty(batch, **f32), torch.empty(batch, **f32), torch.empty(batch, **f32))


def _fake_philox_uniforms(seed, offset, n):
    return torch.empty(seed.shape[0], n, dtype=torch.float32, device=seed.device)


torch.library.register_fake("specdec_fast::skinny_linear", lambda x, weight: x.new_empty(x.shape[0], weight.shape[0]),
                            lib=_LIBRARY)
torch.library.register_fake("specdec_fast::skinny_linear_int8",
                            lambda x, weight, scale: x.new_empty(x.shape[0], weight.shape[0]), lib=_LIBRARY)
for _prefix in ("", "triton_"):
    torch.library.register_fake(f"specdec_fast::{_prefix}verify", _fake_verify, lib=_LIBRARY)
    torch.library.register_fake(f"specdec_fast::{_prefix}verify_block", _fake_verify, lib=_LIBRARY)
    torch.library.register_fake(f"specdec_fast::{_prefix}draft_step", _fake_draft_step, lib=_LIBRARY)
    torch.library.register_fake(f"specdec_fast::{_prefix}philox_uniforms", _fake_philox_uniforms, lib=_LIBRARY)


def _check_jit() -> None:
    if os.environ.get("SPECDEC_FAST_NO_JIT"):
        raise RuntimeError("JIT builds are disabled by SPECDEC_FAST_NO_JIT")


def _build(name: str, sources: list[Path], **kwargs) -> None:
    """Load the ahead-of-time build of an extension (setup.py, SPECDEC_FAST_AOT=1) if there is one,
    else compile it (first time, or when a source changed) and load it; loading registers its ops."""
    built = sorted(PACKAGE.glob(f"_{name}.*.so"))
    if built:
        torch.ops.load_library(str(built[0]))
        return
    _check_jit()
    if not all(s.is_file() for s in sources):
        raise RuntimeError(f"kernel sources not found under {CSRC} (install from a source checkout with pip install -e .)")
    from torch.utils.cpp_extension import load

    build = cache_root() / "build" / name
    build.mkdir(parents=True, exist_ok=True)
    try:
        load(name=f"specdec_fast_{name}", sources=[str(s) for s in sources], build_directory=str(build),
             is_python_module=False, verbose=bool(os.environ.get("SPECDEC_FAST_VERBOSE")), **kwargs)
    except Exception as error:  # a compiler, linker or ninja failure: report it as the reason
        raise RuntimeError(f"building the {name} kernels failed: {error}") from error


@functools.cache
def _load_cpu() -> None:
    """Build (first time) and load the CPU C++ kernels; raises RuntimeError with the reason on failure."""
    # Built where it runs, so -march=native: the vector code (csrc/cpu/simd.h) becomes AVX2,
    # AVX-512 or NEON as this CPU allows. OpenMP makes at::parallel_for parallel.
    flags = ["-O3", "-march=native", "-fopenmp"]
    _build("cpu", [CSRC / "cpu" / "ops.cpp"], extra_cflags=flags, extra_ldflags=["-fopenmp"])


def cuda_arch() -> str:
    """The CUDA architectures to build for: SPECDEC_FAST_CUDA_ARCH, else the GPU's, else 9.0 (H100/H200)."""
    if os.environ.get("SPECDEC_FAST_CUDA_ARCH"):
        return os.environ["SPECDEC_FAST_CUDA_ARCH"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return "9.0"


def _cuda_home() -> str | None:
    """CUDA_HOME or CUDA_PATH, else /usr/local/cuda if it holds nvcc, else torch's guess from nvcc on
    PATH (wrong when that nvcc is a wrapper script outside the toolkit)."""
    from torch.utils import cpp_extension

    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda", cpp_extension.CUDA_HOME):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return home
    return None


@functools.cache
def build_cuda() -> None:
    """Compile, link and load the CUDA kernels (needs nvcc and a CUDA build of torch, not a GPU)."""
    if torch.version.cuda is None:
        raise RuntimeError(f"torch {torch.__version__} is a CPU-only build")
    from torch.utils import cpp_extension

    home = _cuda_home()
    if home is None and not any(PACKAGE.glob("_cuda.*.so")):
        raise RuntimeError("nvcc not found (set CUDA_HOME to a CUDA toolkit)")
    cpp_extension.CUDA_HOME = home  # read by the build; fixed at import from a PATH guess
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch()
    try:
        _build("cuda", [CSRC / "cuda" / "ops.cpp", CSRC / "cuda" / "kernels.cu"],
               extra_cflags=["-O3"], extra_cuda_cflags=["-O3"])
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST")
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


@functools.cache
def _load_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    build_cuda()


@functools.cache
def _load_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"triton is not installed ({error})") from error
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("no CUDA device (TRITON_INTERPRET=1 runs the Triton kernels on the CPU, slowly, for tests)")
    import triton_kernels  # noqa: F401  registers the triton_* ops


LOADERS: dict[str, Callable[[], None]] = {"cpu": _load_cpu, "cuda": _load_cuda, "triton": _load_triton}


def _devices(name: str) -> tuple[str, ...]:
    """Tensor devices a backend runs on (Triton runs CPU tensors under TRITON_INTERPRET=1 only)."""
    if name == "triton":
        return ("cuda", "cpu") if os.environ.get("TRITON_INTERPRET") == "1" else ("cuda",)
    return {"torch": ("cpu", "cuda"), "cpu": ("cpu",), "cuda": ("cuda",)}[name]


AUTO_ORDER = {"cpu": ("cpu",), "cuda": ("cuda", "triton")}  # fastest first, per tensor device


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


REFERENCES = {"verify": verify_reference, "verify_block": verify_block_reference, "draft_step": draft_step_reference,
              "philox_uniforms": philox_uniforms}


def op(name: str, backend: str) -> Callable:
    """The implementation of op ``name`` in a resolved ``backend``."""
    if backend == "torch":
        return REFERENCES[name]
    prefix = "triton_" if backend == "triton" else ""
    return getattr(torch.ops.specdec_fast, prefix + name)
