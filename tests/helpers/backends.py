"""The kernel backends a test runs against, each on the device it runs on here.

cpu always runs (a build failure fails the tests); triton runs on the GPU, or on the CPU
under TRITON_INTERPRET=1 (conftest.py sets it where there is no GPU); cuda needs a GPU and
is skipped, saying so, where there is none.
"""

import os

import pytest
import torch

GPU = torch.cuda.is_available()
TRITON_DEVICE = "cuda" if GPU else "cpu"


def kernel_params(interpreter_too_slow: str | None = None) -> list:
    """pytest params (backend, device). ``interpreter_too_slow``: skip Triton under the
    interpreter with this reason (the test's size needs a GPU)."""
    interpreted = TRITON_DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    triton_skip = interpreter_too_slow if interpreted and interpreter_too_slow else None
    cases = [("cpu", "cpu", None), ("triton", TRITON_DEVICE, triton_skip),
             ("cuda", "cuda", None if GPU else "no CUDA GPU on this machine (hardware absent)")]
    return [pytest.param(backend, device, id=f"{backend}-{device}",
                         marks=[pytest.mark.skipif(True, reason=why)] if why else [])
            for backend, device, why in cases]
