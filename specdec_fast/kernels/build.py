"""Building the C++ and CUDA kernels: ahead of time (``setup.py``, ``SPECDEC_FAST_AOT=1``) or
just in time through ``torch.utils.cpp_extension`` + ninja into the user cache folder, one folder
per build key (:func:`build_key`), announced on stderr with its expected time. The loops load
the kernels before they start their clocks (``warmup()`` before the first request).

Environment switches: ``SPECDEC_FAST_NO_JIT=1`` disables builds, ``SPECDEC_FAST_VERBOSE=1`` shows
them, ``SPECDEC_FAST_CUDA_ARCH`` sets the CUDA architectures (default: the GPU's, or 9.0),
``CUDA_HOME`` the toolkit.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import os
import sys
from pathlib import Path

import torch

from ..paths import cache_root

PACKAGE = Path(__file__).resolve().parents[1]
# Kernel sources: installed inside the package (setup.py copies them), or the source checkout's.
CSRC = PACKAGE / "csrc" if (PACKAGE / "csrc").is_dir() else PACKAGE.parent / "csrc"


EXPECTED = {"cpu": "about 20 s", "cuda": "about 2 min"}  # first build, measured on 2-core VMs


def _cpp_extension():
    """torch.utils.cpp_extension, imported only when a kernel is built or loaded. Importing it looks
    for a CUDA toolkit and, on a machine without a GPU, logs a warning about it that says nothing
    about a CPU build: silenced there."""
    if not torch.cuda.is_available():
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    return cpp_extension


def build_key(name: str, sources: list[Path], flags: dict) -> str:
    """The build folder's name: the extension, and a digest of every source and header it may
    include (contents and folder), torch's version and the flags, so that two installs, two torch
    versions or two sets of flags never share (and rebuild) one folder."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    digest = hashlib.sha256(f"{torch.__version__}|{sorted(flags.items())}|{arch}|{CSRC}".encode())
    for path in sorted(p for p in CSRC.rglob("*") if p.is_file()) + sources:
        digest.update(path.read_bytes())
    return f"{name}-{digest.hexdigest()[:16]}"


def _build(name: str, sources: list[Path], **kwargs) -> None:
    """Load the ahead-of-time build of an extension if there is one, else compile it (first
    time, or when a source changed) and load it; loading registers its ops."""
    built = sorted(PACKAGE.glob(f"_{name}.*.so"))
    if built:
        torch.ops.load_library(str(built[0]))
        return
    if os.environ.get("SPECDEC_FAST_NO_JIT"):
        raise RuntimeError("JIT builds are disabled by SPECDEC_FAST_NO_JIT")
    if not all(s.is_file() for s in sources):
        raise RuntimeError(f"kernel sources not found under {CSRC} (install from a source checkout with pip install -e .)")
    build = cache_root() / "build" / build_key(name, sources, kwargs)
    if not any(build.glob("*.so")):
        print(f"specdec_fast: building the {name} kernels once ({EXPECTED[name]}) into {build}", file=sys.stderr, flush=True)
    build.mkdir(parents=True, exist_ok=True)
    try:
        _cpp_extension().load(name=f"specdec_fast_{name}", sources=[str(s) for s in sources], build_directory=str(build),
                           is_python_module=False, verbose=bool(os.environ.get("SPECDEC_FAST_VERBOSE")), **kwargs)
    except Exception as error:  # a compiler, linker or ninja failure: report it as the reason
        raise RuntimeError(f"building the {name} kernels failed: {error}") from error


@functools.cache
def load_cpu() -> None:
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


def cuda_home() -> str | None:
    """CUDA_HOME or CUDA_PATH, else /usr/local/cuda if it holds nvcc, else torch's guess from nvcc on
    PATH (wrong when that nvcc is a wrapper script outside the toolkit)."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda", _cpp_extension().CUDA_HOME):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return home
    return None


@functools.cache
def build_cuda() -> None:
    """Compile, link and load the CUDA kernels (needs nvcc and a CUDA build of torch, not a GPU)."""
    if torch.version.cuda is None:
        raise RuntimeError(f"torch {torch.__version__} is a CPU-only build")
    home = cuda_home()
    if home is None and not any(PACKAGE.glob("_cuda.*.so")):
        raise RuntimeError("nvcc not found (set CUDA_HOME to a CUDA toolkit)")
    _cpp_extension().CUDA_HOME = home  # read by the build; fixed at import from a PATH guess
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
def load_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    build_cuda()


@functools.cache
def load_triton() -> None:
    """Import the Triton kernels, which registers the ``triton_*`` ops. triton is imported here,
    not at the top: it is optional (absent on macOS, slow to import) and only this backend needs it."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"triton is not installed ({error})") from error
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("no CUDA device (TRITON_INTERPRET=1 runs the Triton kernels on the CPU, slowly, for tests)")
    # specdec_fast._triton is installed from the top-level triton_kernels/ folder (setup.py), outside
    # this package's source tree, so it is named here rather than imported relative to it.
    importlib.import_module("specdec_fast._triton")
