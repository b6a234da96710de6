"""specdec_fast: lossless speculative decoding for PyTorch, with fused verification kernels.

Kernels are built just in time (torch.utils.cpp_extension + ninja) on first use, from the
csrc/ sources, which are installed inside the package (specdec_fast/csrc) so that a
non-editable install builds them too. Ahead of time instead:

    SPECDEC_FAST_AOT=1 pip install --no-build-isolation -e .

builds specdec_fast/_cpu (and specdec_fast/_cuda where torch has CUDA and CUDA_HOME names
a toolkit),
which the loader then takes before any JIT build.
"""

import os
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


class BuildPyWithSources(build_py):
    """Also copy csrc/ into the built package as specdec_fast/csrc."""

    def run(self):
        super().run()
        shutil.copytree(HERE / "csrc", Path(self.build_lib) / "specdec_fast" / "csrc", dirs_exist_ok=True)


def aot_extensions() -> tuple[list, dict]:
    if os.environ.get("SPECDEC_FAST_AOT") != "1":
        return [], {}
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

    # Built on the machine that runs it, or for SPECDEC_FAST_CPU_ARCH (specdec_fast.kernels.build.cpu_arch).
    cpu_flags = ["-O3", f"-march={os.environ.get('SPECDEC_FAST_CPU_ARCH', '').strip() or 'native'}", "-fopenmp"]
    extensions = [CppExtension("specdec_fast._cpu", ["csrc/cpu/ops.cpp"], extra_compile_args=cpu_flags,
                               extra_link_args=["-fopenmp"])]
    if torch.version.cuda is not None and CUDA_HOME is not None:
        # As specdec_fast.kernels.build.cuda_arch: SPECDEC_FAST_CUDA_ARCH, else the GPU's, else 9.0.
        gpu = "%d.%d" % torch.cuda.get_device_capability() if torch.cuda.is_available() else "9.0"
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", os.environ.get("SPECDEC_FAST_CUDA_ARCH", gpu))
        extensions.append(CUDAExtension("specdec_fast._cuda", ["csrc/cuda/ops.cpp", "csrc/cuda/kernels.cu"],
                                        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]}))
    return extensions, {"build_ext": BuildExtension}


extensions, build_ext = aot_extensions()
setup(
    name="specdec_fast",
    version="0.1.0",
    description="Lossless speculative decoding for PyTorch causal LMs, with fused verification kernels",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: C++",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
    python_requires=">=3.10",
    # The Triton kernels live in the top-level triton_kernels/ folder and install as specdec_fast._triton
    # (a top-level module named triton_kernels would shadow the package of that name that triton publishes).
    packages=find_packages(include=["specdec_fast", "specdec_fast.*"]) + ["specdec_fast._triton"],
    package_dir={"specdec_fast._triton": "triton_kernels"},
    package_data={"specdec_fast.data": ["*.safetensors", "*.json", "*.md"],
                  "specdec_fast.transformers_generate": ["custom_generate/*.py"], "specdec_fast": ["py.typed"]},
    # What the decoding loop, the kernel builds, the SmolLM2 loader (the main job) and the training
    # and benchmark commands' progress bars need; plots and Prometheus export are extras.
    install_requires=[
        "torch>=2.4",
        "triton>=3.0; platform_system == 'Linux'",
        "transformers>=5.0",  # the lowest version the tests ran with (DynamicCache(config=), AttentionInterface)
        "safetensors>=0.4",
        "ninja>=1.11",  # just-in-time kernel builds
        "gguf>=0.10",  # SmolLM2 ships as GGUF
        "accelerate>=1.0",
        "tqdm>=4.60",
    ],
    extras_require={
        "bench": ["matplotlib>=3.7"],
        "monitoring": ["prometheus-client>=0.17"],
        "quant": ["torchao>=0.10"],
        # llama.cpp as the pass benchmark's peer: built from source (~10 min on 2 cores); sentencepiece
        # for llama.cpp's GGUF converter.
        "peer": ["llama-cpp-python>=0.3", "sentencepiece>=0.2"],
        "test": ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "import-linter>=2.1", "numpy>=1.24",
                 "matplotlib>=3.7", "prometheus-client>=0.17"],
    },
    entry_points={"console_scripts": ["specdec-fast=specdec_fast.cli:main"]},
    ext_modules=extensions,
    cmdclass={"build_py": BuildPyWithSources, **build_ext},
)
