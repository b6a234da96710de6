"""Tiny random models and what the tests compare them with: the exact joint law of a target's
first tokens, enumerated, and a feature draft that disagrees with its target."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import gguf.quants
import torch
from gguf import GGMLQuantizationType
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_fast.decoding import batch_generate
from specdec_fast.drafts.feature import FeatureDraft
from specdec_fast.kernels import warp_logits
from specdec_fast.kernels.linear import quantize_int8
from specdec_fast.models.lean import LeanLM

PROMPT = [3, 1, 4, 1]
NO_EOS = ()


def tiny_llama(seed: int, vocab: int = 8, layers: int = 2, hidden: int = 32, init: float = 0.2, context: int = 64):
    """A random LlamaForCausalLM; init 0.2 makes its distributions peaked and far from another seed's."""
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        initializer_range=init, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def with_weights_read_as(model, precision: str):
    """A copy of ``model`` whose linear weights are those the lean path reads at ``precision`` ("fp32",
    "bf16" or "int8"), in fp32; each a parameter of its own (a tied head is untied from the
    embeddings, which the lean path reads in fp32)."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if isinstance(module, torch.nn.Linear):
            w = module.weight.detach()
            if precision == "bf16":
                w = w.bfloat16().float()
            elif precision == "int8":
                q, scale = quantize_int8(w)
                w = q.float() * scale[:, None]
            module.weight = torch.nn.Parameter(w, requires_grad=False)
    return twin


def gguf_quantized(weight: torch.Tensor, qtype: str):
    """``weight`` [N, K] quantised to ggml ``qtype`` ("Q4_1", "Q8_0") by the gguf package: the bytes
    of a GGUF file's tensor (numpy uint8, [N, bytes per row])."""
    return gguf.quants.quantize(weight.detach().float().numpy(), GGMLQuantizationType[qtype])


def gguf_roundtrip(weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """``weight`` [N, K] quantised to ggml ``qtype`` and dequantised by the gguf package: the fp32
    values a GGUF loader gives a model stored in that format."""
    kind = GGMLQuantizationType[qtype]
    return torch.from_numpy(gguf.quants.dequantize(gguf_quantized(weight, qtype), kind).reshape(weight.shape).copy())


def as_gguf(model, qtype: str):
    """A copy of ``model`` whose linear weights are :func:`gguf_roundtrip`'s, as if loaded from a
    GGUF file in ``qtype`` (a tied head, and so the embeddings, too)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for module in twin.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(gguf_roundtrip(module.weight, qtype))
    return twin


class LeanForward:
    """``model`` as the lean path computes it at ``precision``, called like a transformers model on
    prefixes [n, L] (the logits of each prefix's last token, [n, 1, V]): exact_joint's model for a
    precision that only the lean path has ("q8")."""

    def __init__(self, model, precision: str):
        self.model, self.precision, self.config = model, precision, model.config

    def __call__(self, prefixes: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.stack([LeanLM(self.model, self.precision).extend(p, 1) for p in prefixes]))


def exact_joint(model, prompt, n_tokens, temperature, top_k, top_p) -> torch.Tensor:
    """P(first n_tokens = z) under the target, for every z: [V] * n_tokens, by enumeration."""
    vocab = model.config.vocab_size
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = torch.tensor([prompt])
    for _ in range(n_tokens):
        with torch.no_grad():
            logits = model(prefixes).logits[:, -1]
        n = logits.shape[0]
        p = warp_logits(logits, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p))
        joint = (joint[:, None] * p.double()).flatten()
        prefixes = torch.cat([prefixes.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(n)[:, None]], 1)
    return joint


def feature_draft(target, vocab_ids=None, seed: int = 5, num_layers: int = 1) -> FeatureDraft:
    """A feature draft with random (untrained) fc weights, so that it disagrees with the target."""
    vocab_ids = torch.arange(target.config.vocab_size) if vocab_ids is None else vocab_ids
    torch.manual_seed(seed)
    draft = FeatureDraft(target, vocab_ids, source_layer=1, num_layers=num_layers)
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)
    return draft.eval()


class CharTokenizer:
    """Token ids = character codes mod 16 (no chat template): enough for prompt sets on tiny models."""

    def __call__(self, text):
        return SimpleNamespace(input_ids=[ord(c) % 16 for c in text])


def batched_samples(target, draft, prompt: list[int], n_tokens: int, runs: int, rows: int = 64, **settings) -> torch.Tensor:
    """The first ``n_tokens`` of ``runs`` independent generations (seeds 0..runs-1), [runs, n_tokens]:
    ``batch_generate`` with ``rows`` requests at a time, each as ``fast_generate`` would give it for
    its seed (the two run one round; tests/decoding/test_batch.py checks they agree seed by seed)."""
    seqs = []
    for start in range(0, runs, rows):
        seeds = list(range(start, min(start + rows, runs)))
        out = batch_generate(target, draft, input_ids=[prompt] * len(seeds), max_new_tokens=n_tokens, seeds=seeds,
                             eos_token_id=NO_EOS, **settings)
        seqs += [o.tokens for o in out.outputs]
    return torch.tensor(seqs)
