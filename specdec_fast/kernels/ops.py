"""Public verification ops: input checks, randomness, and the call into a backend.

Inputs are checked once here, so backends can assume well-formed tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .backends import resolve
from .reference.draft_step import DraftStepOutput
from .reference.verify import STATUS, VerifyOutput
from .registry import op
from .sampling import Generators, SamplingParams, draw_uniforms

VERIFIERS = {"token": "verify", "block": "verify_block"}  # verifier -> op name


def _check_logits(x: Tensor, name: str) -> None:
    """NaN, +inf and rows without a single finite logit are errors; -inf logits mask tokens.

    One reduction per row does it: max propagates NaN, and is +inf (-inf) iff the row has a
    +inf (only -inf)."""
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    row_max = x.amax(-1)
    if bool(torch.isnan(row_max).any()):
        raise ValueError(f"{name} contains NaN")
    if bool((row_max == float("inf")).any()):
        raise ValueError(f"{name} contains +inf")
    if bool((row_max == float("-inf")).any()):
        raise ValueError(f"{name} has a row where every logit is -inf")


def _shaped_uniforms(u: Tensor, shape: tuple[int, ...], device: torch.device) -> Tensor:
    if tuple(u.shape) != shape:
        raise ValueError(f"uniforms must have shape {list(shape)}, got {list(u.shape)}")
    return u.to(device=device, dtype=torch.float32)


def _check_uniform_values(u: Tensor) -> None:
    if not bool(((u > 0) & (u <= 1)).all()):
        raise ValueError(STATUS[3])


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
        return _shaped_uniforms(uniforms, shape, device)
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
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    draft_lens: Tensor | None = None,
    *,
    point_mass: Tensor | None = None,
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
        draft_probs: [B, K, V] the warped distribution q_i each draft token was sampled from;
            or None when every row's draft tokens are fixed proposals (a prompt lookup): q_i is
            then the point mass on X_i, and no [B, K, V] tensor is needed.
        draft_tokens: [B, K] integer; entries at positions >= draft_lens are ignored.
        draft_lens: [B] integer in [0, K] (ragged drafts); default K for every row.
        point_mass: [B] bool, with ``draft_probs``: the rows whose tokens are fixed proposals
            (their draft_probs rows are never read), for batches that mix both kinds.
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

    Raises:
        ValueError naming the problem for bad shapes, dtypes or devices (checked here, no pass
        over the data), and for NaN, +inf or all -inf target rows, bad draft_probs, drafted
        tokens outside [0, V), draft_lens outside [0, K] and uniforms outside (0, 1] (checked by
        the kernel in the rows it reads: target rows up to the stop, draft rows it tests or
        resamples from; a bad value in a row past the stop goes unnoticed). On CUDA the check
        costs one host sync, on the op's status.

    Example:
        >>> out = verify(target_logits, q, x, torch.tensor([3]), sampling=SamplingParams(0.8), generator=g)
        >>> new_tokens = out.tokens[0, : out.num_emitted[0]]
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose from {tuple(VERIFIERS)}")
    if target.dim() != 3:
        raise ValueError(f"target must have shape [B, K+1, V], got {list(target.shape)}")
    if not target.is_floating_point():
        raise ValueError(f"target must be a floating-point tensor, got {target.dtype}")
    batch, k_plus_1, vocab = target.shape
    k, device = k_plus_1 - 1, target.device
    point_mass = _point_mass(draft_probs, point_mass, target)
    if tuple(draft_tokens.shape) != (batch, k) or draft_tokens.is_floating_point():
        raise ValueError(f"draft_tokens must be an integer tensor of shape [B, K] = [{batch}, {k}], got {list(draft_tokens.shape)} {draft_tokens.dtype}")
    if draft_lens is None:
        draft_lens = torch.full((batch,), k, dtype=torch.int64, device=device)
    draft_lens = torch.as_tensor(draft_lens, device=device)
    if tuple(draft_lens.shape) != (batch,) or draft_lens.is_floating_point():
        raise ValueError(f"draft_lens must be an integer tensor of shape [B] = [{batch}], got {list(draft_lens.shape)}")
    for name, t in (("draft_tokens", draft_tokens), ("draft_lens", draft_lens)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but target is on {device}")
    temperature, top_k, top_p = sampling.as_tensors(batch, device)
    backend = resolve(backend, device)
    uniforms = _uniforms((batch, k + 1), uniforms, generator, seed, offset, device, backend)

    logits = target.float().log() if target_is_probs else target
    args = (logits, draft_probs, point_mass, draft_tokens.long(), draft_lens.long(), temperature, top_k, top_p, uniforms)
    *out, status = op(VERIFIERS[verifier], backend)(*args)
    _raise_for_status(status, target_is_probs)
    return VerifyOutput(*out)


def _point_mass(draft_probs: Tensor | None, point_mass: Tensor | None, target: Tensor) -> Tensor:
    """The [B] bool point-mass flags, after the shape, dtype and device checks of draft_probs and point_mass."""
    batch, k_plus_1, vocab = target.shape
    k, device = k_plus_1 - 1, target.device
    if draft_probs is None:
        if point_mass is not None:
            raise ValueError("point_mass marks rows of draft_probs: with draft_probs=None every row is a point mass")
        return torch.ones(batch, dtype=torch.bool, device=device)
    if draft_probs.dim() != 3 or draft_probs.shape[-1] != vocab:
        raise ValueError(
            f"vocabulary mismatch: draft_probs has shape {list(draft_probs.shape)}, target has V = {vocab} "
            f"(expected draft_probs [B, K, V] = [{batch}, {k}, {vocab}])"
        )
    if tuple(draft_probs.shape[:2]) != (batch, k):
        raise ValueError(f"draft_probs must have shape [B, K, V] = [{batch}, {k}, {vocab}], got {list(draft_probs.shape)}")
    if not draft_probs.is_floating_point():
        raise ValueError(f"draft_probs must be a floating-point tensor, got {draft_probs.dtype}")
    if point_mass is None:
        point_mass = torch.zeros(batch, dtype=torch.bool, device=device)
    if tuple(point_mass.shape) != (batch,) or point_mass.dtype != torch.bool:
        raise ValueError(f"point_mass must be a bool tensor of shape [B] = [{batch}], got {list(point_mass.shape)} {point_mass.dtype}")
    for name, t in (("draft_probs", draft_probs), ("point_mass", point_mass)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but target is on {device}")
    return point_mass


def _raise_for_status(status: Tensor, target_is_probs: bool) -> None:
    """ValueError for a verify op's status [B]: the largest code among the rows, and the first row
    with it (one host sync on CUDA; the rest only on an error)."""
    code = int(status.max()) if status.numel() else 0
    if code == 0:
        return
    row = int((status == code).nonzero()[0, 0])
    message = STATUS[code]
    if target_is_probs and code in (4, 5):
        message = "target must hold finite non-negative probabilities"
    elif target_is_probs and code == 6:
        message = "target has a row with no probability mass"
    raise ValueError(f"{message} (row {row})")


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
    _check_logits(logits, "logits")
    temperature, top_k, top_p = sampling.as_tensors(batch, device)
    backend = resolve(backend, device)
    given = uniforms is not None
    uniforms = _uniforms((batch,), uniforms, generator, seed, offset, device, backend)
    if given:  # (drawn ones are in (0, 1] by construction)
        _check_uniform_values(uniforms)
    return DraftStepOutput(*op("draft_step", backend)(logits, temperature, top_k, top_p, uniforms))


__all__ = ["verify", "draft_step", "philox_uniforms", "VerifyOutput", "DraftStepOutput", "SamplingParams"]


def point_mass_step(tokens: Tensor) -> DraftStepOutput:
    """The draft step of a draft that proposes fixed tokens (prompt lookup): q is the point mass on
    each row's token ``tokens`` [B] int64 at every temperature, top-k and top-p, so this is what
    :func:`draft_step` returns for logits that are -inf everywhere but the token, without a pass
    over V and without materialising q: probs None (pass ``draft_probs=None`` to :func:`verify`),
    q(token) 1, entropy 0, top-1 probability 1."""
    ones = torch.ones(len(tokens), device=tokens.device)
    return DraftStepOutput(tokens, None, ones, torch.zeros_like(ones), ones)
