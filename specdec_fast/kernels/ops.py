"""Public verification ops: input checks, randomness, and the call into a backend.

Inputs are checked once here, so backends can assume well-formed tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .backends import resolve
from .reference.draft_step import DraftStepOutput
from .reference.verify import VerifyOutput
from .registry import op
from .sampling import Generators, SamplingParams, draw_uniforms

VERIFIERS = {"token": "verify", "block": "verify_block"}  # verifier -> op name


def _check_logits(x: Tensor, name: str, is_probs: bool) -> None:
    """NaN, +inf and rows without a single finite logit are errors; -inf logits mask tokens.

    One reduction per row does it: max propagates NaN, and is +inf (-inf) iff the row has a
    +inf (only -inf)."""
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    row_max = x.amax(-1)
    if bool(torch.isnan(row_max).any()):
        raise ValueError(f"{name} contains NaN")
    if is_probs:
        if not bool(x.amin() >= 0) or bool(torch.isinf(row_max).any()):
            raise ValueError(f"{name} must hold finite non-negative probabilities")
        if bool((row_max <= 0).any()):
            raise ValueError(f"{name} has a row with no probability mass")
    else:
        if bool((row_max == float("inf")).any()):
            raise ValueError(f"{name} contains +inf")
        if bool((row_max == float("-inf")).any()):
            raise ValueError(f"{name} has a row where every logit is -inf")


def _check_uniforms(u: Tensor, shape: tuple[int, ...], device: torch.device) -> Tensor:
    if tuple(u.shape) != shape:
        raise ValueError(f"uniforms must have shape {list(shape)}, got {list(u.shape)}")
    u = u.to(device=device, dtype=torch.float32)
    if not bool(((u > 0) & (u <= 1)).all()):
        raise ValueError("uniforms must lie in (0, 1]: a uniform of exactly 0 would accept any draft token")
    return u


def _per_request(value, batch: int, device: torch.device, name: str) -> Tensor:
    t = torch.as_tensor(value, device=device)
    if t.is_floating_point() or t.dim() > 1 or (t.dim() == 1 and t.shape[0] != batch):
        raise ValueError(f"{name} must be an integer or an integer tensor of shape [B] = [{batch}]")
    return t.to(torch.int64).expand(batch).contiguous()


def _uniforms(shape: tuple[int, ...], uniforms, generator, seed, offset, device: torch.device, backend: str) -> Tensor:
    """Uniforms in (0, 1] of ``shape`` ([B] or [B, n]): given, drawn from ``generator``, or Philox on (seed, offset + i)."""
    if sum(x is not None for x in (uniforms, generator, seed)) > 1:
        raise ValueError("pass at most one source of randomness: uniforms, generator, or seed (+ offset)")
    if uniforms is not None:
        return _check_uniforms(uniforms, shape, device)
    batch, n = shape[0], shape[1] if len(shape) == 2 else 1
    if seed is not None:
        seed, offset = _per_request(seed, batch, device, "seed"), _per_request(offset, batch, device, "offset")
        return op("philox_uniforms", backend)(seed, offset, n).reshape(shape)
    return draw_uniforms(batch, n, generator, device).reshape(shape)


def philox_uniforms(seed: int | Tensor, offset: int | Tensor, n: int, *, batch: int | None = None,
                    device: torch.device | str = "cpu", backend: str = "auto") -> Tensor:
    """Counter-based uniforms in (0, 1] (Philox4x32-10): row b, entry i depends on (seed_b, offset_b + i) only.

    Shape: seed, offset: ints or int64 [B] -> fp32 [B, n]. Every backend gives the same bits.
    """
    if batch is None:
        batch = next((t.shape[0] for t in (seed, offset) if isinstance(t, Tensor) and t.dim() == 1), 1)
    device = torch.device(device) if not isinstance(seed, Tensor) else seed.device
    return _uniforms((batch, n), None, None, seed, offset, device, resolve(backend, device))


def verify(
    target: Tensor,
    draft_probs: Tensor,
    draft_tokens: Tensor,
    draft_lens: Tensor | None = None,
    *,
    sampling: SamplingParams = SamplingParams(),
    target_is_probs: bool = False,
    uniforms: Tensor | None = None,
    generator: Generators = None,
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    verifier: str = "token",
    backend: str = "auto",
) -> VerifyOutput:
    """Verify B drafts against the target, losslessly (docs/design.md).

    Shape:
        target: [B, K+1, V] logits (fp32/bf16/fp16), or probabilities if ``target_is_probs``
            (then warped as logits log(p): pass the default ``sampling`` for final probabilities).
            Row i is the target's distribution after the first i draft tokens.
        draft_probs: [B, K, V] the warped distribution q_i each draft token was sampled from.
        draft_tokens: [B, K] integer; entries at positions >= draft_lens are ignored.
        draft_lens: [B] integer in [0, K] (ragged drafts); default K for every row.
        sampling: :class:`SamplingParams`, one setting for every row or one per row ([B]); the
            same warping the draft used.
        uniforms: [B, K+1] in (0, 1]: K acceptance tests, then the emitted token's sample.
            Or drawn from ``generator`` (one, or one per row), or counter-based from ``seed``
            and ``offset`` (ints or [B]): row b uses Philox(seed_b, offset_b + i), i <= K,
            so its result never depends on the rest of the batch.
        verifier: "token" (Leviathan et al. 2023: accept each X_i with min(1, p/q)) or "block"
            (Sun et al. 2025: never fewer accepted tokens in expectation; same output law).
        backend: "auto" | "torch" | "cpu" | "cuda" | "triton" (see :func:`backends`).

    Returns:
        VerifyOutput(num_accepted [B], tokens [B, K+1] padded with -1, num_emitted [B]).

    Example:
        >>> out = verify(target_logits, q, x, torch.tensor([3]), sampling=SamplingParams(0.8), generator=g)
        >>> new_tokens = out.tokens[0, : out.num_emitted[0]]
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose from {tuple(VERIFIERS)}")
    if target.dim() != 3:
        raise ValueError(f"target must have shape [B, K+1, V], got {list(target.shape)}")
    batch, k_plus_1, vocab = target.shape
    k, device = k_plus_1 - 1, target.device
    if draft_probs.dim() != 3 or draft_probs.shape[-1] != vocab:
        raise ValueError(
            f"vocabulary mismatch: draft_probs has shape {list(draft_probs.shape)}, target has V = {vocab} "
            f"(expected draft_probs [B, K, V] = [{batch}, {k}, {vocab}])"
        )
    if tuple(draft_probs.shape[:2]) != (batch, k):
        raise ValueError(f"draft_probs must have shape [B, K, V] = [{batch}, {k}, {vocab}], got {list(draft_probs.shape)}")
    if tuple(draft_tokens.shape) != (batch, k) or draft_tokens.is_floating_point():
        raise ValueError(f"draft_tokens must be an integer tensor of shape [B, K] = [{batch}, {k}], got {list(draft_tokens.shape)} {draft_tokens.dtype}")
    if draft_lens is None:
        draft_lens = torch.full((batch,), k, dtype=torch.int64, device=device)
    draft_lens = torch.as_tensor(draft_lens, device=device)
    if tuple(draft_lens.shape) != (batch,) or draft_lens.is_floating_point():
        raise ValueError(f"draft_lens must be an integer tensor of shape [B] = [{batch}], got {list(draft_lens.shape)}")
    draft_lens = draft_lens.long()
    if bool(((draft_lens < 0) | (draft_lens > k)).any()):
        raise ValueError(f"draft_lens must lie in [0, K] = [0, {k}], got {draft_lens.tolist()}")
    for name, t in (("draft_probs", draft_probs), ("draft_tokens", draft_tokens), ("draft_lens", draft_lens)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but target is on {device}")
    draft_tokens = draft_tokens.long()
    drafted = torch.arange(k, device=device)[None, :] < draft_lens[:, None]
    if bool((drafted & ((draft_tokens < 0) | (draft_tokens >= vocab))).any()):
        raise ValueError(f"draft_tokens has a drafted token outside [0, V) = [0, {vocab})")
    _check_logits(target, "target", target_is_probs)
    # Rows past a draft length may be anything non-negative (zeros included), so no mass check here.
    valid_probs = draft_probs.is_floating_point() and (
        draft_probs.numel() == 0 or (bool(draft_probs.amin() >= 0) and bool(draft_probs.amax() < float("inf")))
    )
    if not valid_probs:
        nan = draft_probs.is_floating_point() and bool(draft_probs.isnan().any())
        raise ValueError("draft_probs contains NaN" if nan else "draft_probs must hold finite non-negative probabilities")
    temperature, top_k, top_p = sampling.as_tensors(batch, device)
    backend = resolve(backend, device)
    uniforms = _uniforms((batch, k + 1), uniforms, generator, seed, offset, device, backend)

    logits = target.float().log() if target_is_probs else target
    args = (logits, draft_probs.float(), draft_tokens, draft_lens, temperature, top_k, top_p, uniforms)
    return VerifyOutput(*op(VERIFIERS[verifier], backend)(*args))


def draft_step(
    logits: Tensor,
    *,
    sampling: SamplingParams = SamplingParams(),
    uniforms: Tensor | None = None,
    generator: Generators = None,
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    backend: str = "auto",
) -> DraftStepOutput:
    """Sample the next draft token of B rows and report the features a draft-length policy uses.

    Shape:
        logits: [B, V] the draft model's logits (fp32/bf16/fp16).
        sampling: :class:`SamplingParams`, one setting for every row or one per row ([B]).
        uniforms: [B] in (0, 1]; or drawn from ``generator`` (one, or one per row), or
            Philox(seed_b, offset_b) (see :func:`verify`).

    Returns:
        DraftStepOutput(tokens [B] int64, probs [B, V] fp32 (q), token_prob [B] (q(token)),
        entropy [B] (H(q), nats), top1_prob [B] (max q)); for greedy rows (q a point mass)
        the last three describe the distribution at temperature 1 instead.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [B, V], got {list(logits.shape)}")
    batch, device = logits.shape[0], logits.device
    _check_logits(logits, "logits", is_probs=False)
    temperature, top_k, top_p = sampling.as_tensors(batch, device)
    backend = resolve(backend, device)
    uniforms = _uniforms((batch,), uniforms, generator, seed, offset, device, backend)
    return DraftStepOutput(*op("draft_step", backend)(logits, temperature, top_k, top_p, uniforms))


__all__ = ["verify", "draft_step", "philox_uniforms", "VerifyOutput", "DraftStepOutput", "SamplingParams"]


def point_mass_step(tokens: Tensor, vocab: int) -> DraftStepOutput:
    """The draft step of a draft that proposes fixed tokens (prompt lookup): q is the point mass on
    each row's token ``tokens`` [B] int64 at every temperature, top-k and top-p, so this is what
    :func:`draft_step` returns for logits that are -inf everywhere but the token, without a pass
    over V: probs one-hot [B, V] fp32, q(token) 1, entropy 0, top-1 probability 1."""
    rows = torch.arange(len(tokens), device=tokens.device)
    probs = torch.zeros(len(tokens), vocab, device=tokens.device)
    probs[rows, tokens] = 1.0
    ones = torch.ones(len(tokens), device=tokens.device)
    return DraftStepOutput(tokens, probs, ones, torch.zeros_like(ones), ones)
