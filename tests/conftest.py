"""Shared fixtures: tiny random transformers models (fast unit tests) and the real SmolLM2 target."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run on the CPU under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


def tiny_llama(seed: int, vocab: int = 8, layers: int = 2, hidden: int = 32, init: float = 0.2, context: int = 64):
    """A random LlamaForCausalLM; init 0.2 makes its distributions peaked and far from another seed's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        initializer_range=init, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft) with vocab 8: a 2-layer target and a 1-layer draft of another seed."""
    return tiny_llama(0), tiny_llama(1, layers=1)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct, converted once into the user cache."""
    from specdec_fast import load_smollm2

    return load_smollm2()
