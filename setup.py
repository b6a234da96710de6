"""specdec_fast: lossless speculative decoding for PyTorch, with fused verification kernels.

Kernels are built just in time (torch.utils.cpp_extension + ninja) on first use, from
csrc/ in the source checkout (install with pip install -e .).
"""

from setuptools import find_packages, setup

setup(
    name="specdec_fast",
    version="0.1.0",
    description="Lossless speculative decoding for PyTorch causal LMs, with fused verification kernels",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["specdec_fast", "specdec_fast.*"]),
    package_data={"specdec_fast.data": ["*.safetensors", "*.json", "*.md"]},
    install_requires=[
        "torch>=2.4",
        "transformers>=5.0",
        "gguf>=0.10",  # SmolLM2 ships as GGUF
        "accelerate>=1.0",
        "safetensors>=0.4",
        "numpy>=1.24",
        "tqdm>=4.60",
        "ninja>=1.11",
        "pybind11>=2.12",
        "matplotlib>=3.7",
    ],
    extras_require={"test": ["pytest>=8", "hypothesis>=6.100", "scipy>=1.10"]},
    entry_points={"console_scripts": ["specdec-fast=specdec_fast.cli:main"]},
)
