"""Verification kernels and their public ops: one pure-torch reference per op (``reference/``,
the specification), one kernel per backend (CPU C++, CUDA C++, Triton), and the choice between
them (``backend="auto"``). Nothing here knows about models."""

from .backends import backends
from .linear import skinny_linear, skinny_linear_int8
from .ops import DraftStepOutput, VerifyOutput, draft_step, philox_uniforms, point_mass_step, verify
from .sampling import SamplingParams, warp_logits

__all__ = ["DraftStepOutput", "SamplingParams", "VerifyOutput", "backends", "draft_step", "philox_uniforms",
           "point_mass_step", "skinny_linear", "skinny_linear_int8", "verify", "warp_logits"]
