"""Triton kernels of specdec_fast: verify (token-wise and block), draft step and counter-based uniforms.

This folder installs as ``specdec_fast._triton``. Importing it registers the kernels as the ops
``torch.ops.specdec_fast.triton_verify``, ``triton_verify_block``, ``triton_draft_step`` and
``triton_philox_uniforms`` (schemas and fake implementations in specdec_fast/kernels/registry.py,
which must be imported first: specdec_fast.kernels.backends does both). They run on CUDA tensors, and on CPU tensors under
``TRITON_INTERPRET=1`` (how the tests run them without a GPU).
"""

import torch

from .draft_step import draft_step
from .philox import philox_uniforms
from .verify import verify, verify_block

_LIBRARY = torch.library.Library("specdec_fast", "IMPL")  # kept alive: it owns the registrations
for _name, _fn in (("triton_verify", verify), ("triton_verify_block", verify_block),
                   ("triton_draft_step", draft_step), ("triton_philox_uniforms", philox_uniforms)):
    _LIBRARY.impl(_name, _fn, "CompositeExplicitAutograd")

__all__ = ["verify", "verify_block", "draft_step", "philox_uniforms"]
