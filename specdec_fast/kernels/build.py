"""Building the C++ and CUDA kernels: ahead of time (``setup.py``, ``SPECDEC_FAST_AOT=1``) or
just in time through ``torch.utils.cpp_extension`` + ninja into the user cache folder, one folder
per build key (:func:`build_key`), announced on stderr with its expected time. The loops load
the kernels before they start their clocks (``warmup()`` before the first request).

Environment switches: ``SPECDEC_FAST_NO_JIT=1`` disables builds, ``SPECDEC_FAST_VERBOSE=1`` shows
them, ``SPECDEC_FAST_CPU_ARCH`` the instruction set of the CPU kernels (a ``-march`` value, default
``native``: ``x86-64-v3`` builds the AVX2 kernels on an AVX-512 machine), ``SPECDEC_FAST_CUDA_ARCH`` the
CUDA architectures (default: the GPU's, or 9.0), ``CUDA_HOME`` the toolkit.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import os
import subprocess
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


# The vector extensions the CPU kernels care about (csrc/cpu/simd.h, skinny_linear.h), as the
# compiler's macros, in the order isa_name reports them.
ISA_MACROS = {"__AVX512F__": "AVX-512", "__AVX512VNNI__": "VNNI", "__AVX2__": "AVX2", "__FMA__": "FMA", "__F16C__": "F16C",
              "__ARM_NEON": "NEON", "__ARM_FEATURE_DOTPROD": "dotprod", "__SSE4_2__": "SSE4.2"}


def cpu_arch() -> str:
    """The ``-march`` of the CPU kernels: ``SPECDEC_FAST_CPU_ARCH``, else ``native`` (built where it runs)."""
    return os.environ.get("SPECDEC_FAST_CPU_ARCH", "").strip() or "native"


@functools.cache
def compiler_isa(arch: str) -> tuple[str, ...]:
    """The ISA_MACROS names that the C++ compiler enables for ``-march=arch``, in ISA_MACROS order;
    a ValueError naming the problem where the compiler rejects ``arch``."""
    compiler = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([compiler, f"-march={arch}", "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                             text=True, timeout=60)
    except OSError as error:
        raise ValueError(f"no C++ compiler to build the CPU kernels ({compiler}: {error})") from error
    if out.returncode:
        said = [line for line in out.stderr.splitlines() if "error" in line] or out.stderr.splitlines() or [""]
        raise ValueError(f"the compiler rejects -march={arch}: {said[0].strip()}")
    defined = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("#define ")}
    return tuple(name for macro, name in ISA_MACROS.items() if macro in defined)


def isa_name(isa: tuple[str, ...]) -> str:
    """A build's vector ISA in words: "AVX-512 (VNNI)", "AVX2 + FMA", "NEON", "SSE4.2" or "generic"."""
    if "AVX-512" in isa:
        return "AVX-512" + (" (VNNI)" if "VNNI" in isa else "")
    if "AVX2" in isa:
        return "AVX2 + FMA" if "FMA" in isa else "AVX2"
    return next((name for name in ("NEON", "SSE4.2") if name in isa), "generic")


def cpu_build() -> dict:
    """The CPU kernels' build as a benchmark records it: arch (the -march), isa (its vector ISA in
    words) and native (this CPU's, as -march=native sees it)."""
    arch = cpu_arch()
    return dict(arch=arch, isa=isa_name(compiler_isa(arch)), native=isa_name(compiler_isa("native")))


def check_cpu_arch(arch: str) -> None:
    """A ValueError where ``-march=arch`` enables an extension this CPU lacks (its kernels would stop
    with an illegal instruction) or the compiler rejects it."""
    missing = set(compiler_isa(arch)) - set(compiler_isa("native"))
    if missing:
        raise ValueError(f"SPECDEC_FAST_CPU_ARCH={arch} needs {', '.join(sorted(missing))}, which this CPU lacks")


@functools.cache
def load_cpu() -> None:
    """Build (first time) and load the CPU C++ kernels for ``-march=`` :func:`cpu_arch`; raises
    RuntimeError with the reason on failure (an arch this CPU cannot run included)."""
    # The vector code (csrc/cpu/simd.h) becomes AVX2, AVX-512 or NEON as the arch allows; the arch is
    # one of the flags, so each has its own build folder. OpenMP makes at::parallel_for parallel.
    arch = cpu_arch()
    if arch != "native":
        try:
            check_cpu_arch(arch)
        except ValueError as error:
            raise RuntimeError(str(error)) from error
    _build("cpu", [CSRC / "cpu" / "ops.cpp"], extra_cflags=["-O3", f"-march={arch}", "-fopenmp"], extra_ldflags=["-fopenmp"])


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
