"""The op registry: each op's schema (defined once, with ``torch.library``), its fake
implementation for ``torch.compile``, its pure-torch reference, and the lookup of an op in a
backend.

``torch.ops.specdec_fast.verify`` (token-wise), ``verify_block``, ``draft_step`` and
``philox_uniforms`` are implemented for CPU tensors by ``csrc/cpu`` and for CUDA tensors by
``csrc/cuda`` (the dispatcher routes by device); ``triton_verify``, ``triton_verify_block``,
``triton_draft_step`` and ``triton_philox_uniforms`` by the Triton kernels
(``specdec_fast._triton``, the top-level ``triton_kernels/`` folder); ``skinny_linear``,
``skinny_linear_int8``, ``integer_linear`` and ``decoder_pass`` by ``csrc/cpu`` only.
"""

from __future__ import annotations

from typing import Callable

import torch

from .philox import philox_uniforms
from .reference import draft_step_reference, verify_block_reference, verify_reference

VERIFY_SCHEMA = ("(Tensor target_logits, Tensor? draft_probs, Tensor point_mass, Tensor draft_tokens, Tensor draft_lens, "
                 "Tensor temperature, Tensor top_k, Tensor top_p, Tensor uniforms) -> (Tensor, Tensor, Tensor, Tensor)")
SCHEMAS = {
    "verify": VERIFY_SCHEMA,  # token-wise
    "verify_block": VERIFY_SCHEMA,  # block verification
    "draft_step": "(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor uniforms) "
                  "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "philox_uniforms": "(Tensor seed, Tensor offset, int n) -> Tensor",
}
REFERENCES = {"verify": verify_reference, "verify_block": verify_block_reference, "draft_step": draft_step_reference,
              "philox_uniforms": philox_uniforms}

_LIBRARY = torch.library.Library("specdec_fast", "DEF")  # kept alive: it owns the schemas
for _name, _schema in SCHEMAS.items():
    for _prefix in ("", "triton_"):
        _LIBRARY.define(_prefix + _name + _schema)
_LIBRARY.define("skinny_linear(Tensor x, Tensor weight) -> Tensor")
_LIBRARY.define("skinny_linear_int8(Tensor x, Tensor weight, Tensor scale) -> Tensor")
_LIBRARY.define("decoder_pass(Tensor x, Tensor[] norms, Tensor[] weights, Tensor[] scales, Tensor[] qkv_bias, "
                "Tensor cos, Tensor sin, Tensor rows, Tensor positions, Tensor slots, Tensor(a!) cache, Tensor logit_rows, "
                "int heads, int kv_heads, float eps, bool integer=False) -> (Tensor, Tensor)")
_LIBRARY.define("integer_linear(Tensor x, Tensor codes, Tensor scale) -> Tensor")
_LIBRARY.define("lookup_add(Tensor tokens, Tensor start, Tensor end, Tensor(a!) keys, Tensor(b!) next, int max_n) -> ()")
_LIBRARY.define("lookup_propose(Tensor tokens, Tensor lengths, Tensor keys, Tensor next, int min_n, int max_n, int k) "
                "-> (Tensor, Tensor, Tensor)")
_LIBRARY.define("lookup_propose_in(Tensor tokens, Tensor lengths, Tensor source, Tensor source_length, Tensor keys, "
                "Tensor next, int min_n, int max_n, int k) -> (Tensor, Tensor, Tensor)")


def _fake_verify(target_logits, draft_probs, point_mass, draft_tokens, draft_lens, temperature, top_k, top_p, uniforms):
    batch, k_plus_1 = target_logits.shape[:2]
    longs = dict(dtype=torch.int64, device=target_logits.device)
    return (torch.empty(batch, **longs), torch.empty(batch, k_plus_1, **longs), torch.empty(batch, **longs),
            torch.empty(batch, **longs))


def _fake_draft_step(logits, temperature, top_k, top_p, uniforms):
    batch, vocab = logits.shape
    f32 = dict(dtype=torch.float32, device=logits.device)
    return (torch.empty(batch, dtype=torch.int64, device=logits.device), torch.empty(batch, vocab, **f32),
            torch.empty(batch, **f32), torch.empty(batch, **f32), torch.empty(batch, **f32))


def _fake_philox_uniforms(seed, offset, n):
    return torch.empty(seed.shape[0], n, dtype=torch.float32, device=seed.device)


def _fake_decoder_pass(x, norms, weights, scales, qkv_bias, cos, sin, rows, positions, slots, cache, logit_rows, heads,
                      kv_heads, eps, integer=False):
    return x.new_empty(x.shape), x.new_empty(logit_rows.shape[0], weights[-1].shape[0])


def _fake_skinny(x, weight, scale=None):
    return x.new_empty(x.shape[0], weight.shape[0])


torch.library.register_fake("specdec_fast::skinny_linear", _fake_skinny, lib=_LIBRARY)
torch.library.register_fake("specdec_fast::skinny_linear_int8", _fake_skinny, lib=_LIBRARY)
torch.library.register_fake("specdec_fast::integer_linear", _fake_skinny, lib=_LIBRARY)
torch.library.register_fake("specdec_fast::decoder_pass", _fake_decoder_pass, lib=_LIBRARY)
for _prefix in ("", "triton_"):
    torch.library.register_fake(f"specdec_fast::{_prefix}verify", _fake_verify, lib=_LIBRARY)
    torch.library.register_fake(f"specdec_fast::{_prefix}verify_block", _fake_verify, lib=_LIBRARY)
    torch.library.register_fake(f"specdec_fast::{_prefix}draft_step", _fake_draft_step, lib=_LIBRARY)
    torch.library.register_fake(f"specdec_fast::{_prefix}philox_uniforms", _fake_philox_uniforms, lib=_LIBRARY)


def op(name: str, backend: str) -> Callable:
    """The implementation of op ``name`` in a resolved ``backend`` (see :func:`~.backends.resolve`)."""
    if backend == "torch":
        return REFERENCES[name]
    prefix = "triton_" if backend == "triton" else ""
    return getattr(torch.ops.specdec_fast, prefix + name)
