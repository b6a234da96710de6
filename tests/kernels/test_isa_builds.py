"""The CPU kernels built for each instruction set keep the exactness contract: on the native build,
on the AVX2 build an AVX-512 machine makes with SPECDEC_FAST_CPU_ARCH=x86-64-v3, on a generic x86
build and on an Arm NEON build run under qemu (csrc/tests/ops_driver.cpp: the ops against double
references, a token's outputs independent of the pass size, blocks equal to their fp32 matrices, the
integer block product equal to its scalar statement and the same bits on every build).
A build for instructions this CPU lacks is refused with the reason, and the loops fall back."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_fast.kernels.build import CSRC, check_cpu_arch, compiler_isa, cpu_build, isa_name

DRIVER = CSRC / "tests" / "ops_driver.cpp"
X86 = platform.machine() in ("x86_64", "AMD64")


NEON = shutil.which("aarch64-linux-gnu-g++") is not None and shutil.which("qemu-aarch64") is not None
NO_NEON = "no Arm cross toolchain here (apt-get install g++-aarch64-linux-gnu qemu-user; .ci/run does)"
QEMU = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
BUILDS = {  # name: (compiler, flags, runner)
    "native": ("c++", ["-march=native"], []),
    "generic x86-64": ("c++", ["-march=x86-64"], []),
    "NEON": ("aarch64-linux-gnu-g++", [], QEMU),
    "NEON + dot product": ("aarch64-linux-gnu-g++", ["-march=armv8.2-a+dotprod"], QEMU),
}


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """The driver's output for a build of :data:`BUILDS`, built and run once per module."""
    outputs = {}

    def run(name: str) -> str:
        if name not in outputs:
            compiler, flags, runner = BUILDS[name]
            binary = tmp_path_factory.mktemp("driver") / "ops_driver"
            subprocess.run([compiler, "-O2", "-std=c++17", "-fopenmp", "-Wno-psabi", *flags, f"-I{CSRC / 'cpu'}", str(DRIVER),
                            "-o", str(binary)], check=True, capture_output=True, text=True)
            done = subprocess.run([*runner, str(binary)], capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
            outputs[name] = done.stdout
        return outputs[name]

    return run


def test_the_native_build_passes_the_driver(driver):
    assert "0 failed" in driver("native")


@pytest.mark.skipif(not X86, reason="the generic x86-64 build needs an x86 CPU (hardware absent)")
def test_a_generic_x86_build_without_fma_passes_the_driver(driver):
    """No FMA, 8 registers' tiles: other bits than the native build's, the same contract."""
    assert "8 vector registers" in driver("generic x86-64")


@pytest.mark.skipif(not NEON, reason=NO_NEON)
@pytest.mark.parametrize("build", ["NEON", "NEON + dot product"])
def test_the_neon_build_passes_the_driver_under_emulation(driver, build):
    out = driver(build)
    assert "0 failed" in out and "16 vector registers" in out


def test_the_integer_product_has_the_same_bits_on_every_build(driver):
    """Each build checks its integer block product against the scalar statement of the arithmetic
    (bit for bit) and prints a digest of those outputs: one digest for AVX2 (maddubs), plain C++
    (generic x86, Arm without the dot product) and Arm's sdot, so the same prompt gives the same
    products on each. (The decoder pass around them is not bit-identical across builds: its norms and
    attention sum fp32 in lanes as wide as the ISA's vectors.)"""
    names = [name for name in BUILDS if (X86 or name != "generic x86-64") and (NEON or not name.startswith("NEON"))]
    digests = {name: re.search(r"integer digest ([0-9a-f]+)", driver(name)).group(1) for name in names}
    assert len(set(digests.values())) == 1, digests


def test_the_build_names_its_isa_and_refuses_what_the_cpu_lacks():
    build = cpu_build()
    assert build["arch"] == "native" and build["isa"] == isa_name(compiler_isa("native"))
    with pytest.raises(ValueError, match="rejects -march=not-a-cpu"):
        check_cpu_arch("not-a-cpu")
    if X86 and "AVX-512" not in compiler_isa("native"):
        with pytest.raises(ValueError, match="x86-64-v4 needs AVX-512, which this CPU lacks"):
            check_cpu_arch("x86-64-v4")


CHILD = """
import torch
from specdec_fast.kernels.build import cpu_build
from specdec_fast.models.lean import LeanLM
from helpers.models import as_gguf, tiny_llama
model = as_gguf(tiny_llama(7, vocab=96, layers=2, hidden=64, context=256), "Q4_1")
ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(0))
blocks, dense = LeanLM(model), LeanLM(model, "fp32-dense")
for lm in (blocks, dense):
    lm.extend(ids[:20], 1)
together = blocks.extend(ids[20:29], 9)
blocks.crop(20)
alone = torch.cat([blocks.extend(t[None], 1) for t in ids[20:29]])
assert torch.equal(together, alone), "a token's logits depend on the pass size"
assert torch.equal(dense.extend(ids[20:29], 9), together), "blocks differ from their fp32 matrices"
integer = LeanLM(model, "q8")
integer.extend(ids[:20], 1)
together = integer.extend(ids[20:29], 9)
integer.crop(20)
alone = torch.cat([integer.extend(t[None], 1) for t in ids[20:29]])
assert torch.equal(together, alone), "8-bit activations: a token's logits depend on the pass size"
print(cpu_build()["isa"])
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["native", "x86-64-v3"])
def test_each_build_keeps_the_exactness_contract(arch, tmp_path):
    """In a fresh process built for ``arch`` (x86-64-v3: the AVX2 kernels, also on an AVX-512 CPU): a
    token's logits over Q4_1 blocks are the same bits in a pass of 9 tokens as alone, and equal to
    those over the fp32 matrices; with 8-bit activations too, the same bits in a pass of 9 as alone."""
    if arch != "native":
        if not X86:
            pytest.skip(f"-march={arch} needs an x86 CPU (hardware absent)")
        try:
            check_cpu_arch(arch)
        except ValueError as error:
            pytest.skip(f"{error} (hardware absent)")
    env = dict(os.environ, SPECDEC_FAST_CPU_ARCH=arch, PYTHONPATH=str(Path(__file__).parents[1]))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == isa_name(compiler_isa(arch))
