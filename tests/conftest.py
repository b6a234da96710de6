"""Shared fixtures: tiny random transformers models (fast unit tests) and the real SmolLM2 target."""

from __future__ import annotations

import os

import torch

# Before triton is imported (transformers may import it): where there is no GPU, the Triton
# kernels run on the CPU under the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from specdec_fast.models import load_smollm2  # noqa: E402

from helpers.models import tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft) with vocab 8: a 2-layer target and a 1-layer draft of another seed."""
    return tiny_llama(0), tiny_llama(1, layers=1)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct, converted once into the user cache."""
    return load_smollm2()


def pytest_collection_modifyitems(items):
    """The fast tier (-m "not slow") runs Triton under the interpreter (no GPU) on vocabularies of
    up to 4,096 entries: an interpreted program walks a row in Python-driven tiles, so 49,152 and
    262,144 entries take seconds per case. Those cases and the interpreted fuzzer run in the full suite."""
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        interpreted = params.get("backend") == "triton" and params.get("device") == "cpu"
        if interpreted and (params.get("vocab", 0) > 4096 or item.originalname.startswith("test_fuzz")):
            item.add_marker(pytest.mark.slow)
