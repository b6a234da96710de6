"""Measuring a loop's costs on the machine that runs it (:class:`~specdec_fast.policies.calibration.Calibration`).

:func:`calibrate` times, on the caches the loop itself runs (the same target path, precision,
draft and threads), the target's pass over 1..K + 1 tokens, a plain round (an autoregressive
step) and whole speculative rounds of K drafts (which give the draft step and the round's fixed
part) after a short context, the passes again after the longer context those rounds leave, a
large matrix product and a memory read; every call of a repeat in turn, medians kept. :func:`calibration_for` returns the calibration stored in the user
cache for that key, measuring it the first time (``warmup()`` does it before the first request;
otherwise the first generation pays for it, well under a second on the default target).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time

import torch

from ..drafts.binding import cached_pair
from ..drafts.hybrid import Hybrid
from ..drafts.lookup import PromptLookup
from ..kernels import SamplingParams
from ..kernels.build import cpu_build
from ..models.batched_lm import BatchedCachedLM, OneSequence
from ..models.lean import LeanLM, lean_precision
from ..policies.calibration import Calibration, calibration_key, load_calibration, model_identity, save_calibration
from ..policies.costs import interpolate
from ..policies.guard import SpeculationGuard
from ..policies.mdp import DraftPolicy, SpeculativePolicy
from ..policies.measure import medians_in_turn
from ..policies.shipped import default_sources
from ..policies.sources import CostAwareSources
from .outputs import GenerationStats
from .requests import Request
from .round import load_kernels, prefill, speculative_round

MAX_CALIBRATED = 16  # the longest draft a calibration times
CONTEXT = 32  # cached tokens before the timed passes and rounds (the rounds then lengthen it)
_MEMORY: dict[str, Calibration] = {}  # calibrations of this process, by key


def draft_identity(draft) -> str:
    """What tells drafts apart in a calibration's key: none, a lookup's settings, a model's identity."""
    if draft is None:
        return "none"
    if isinstance(draft, PromptLookup):
        return f"lookup({draft.max_n},{draft.min_n},{draft.max_tokens})"
    if isinstance(draft, Hybrid):
        return f"hybrid({draft_identity(draft.model)},{draft_identity(draft.lookup)})"
    return model_identity(draft) if isinstance(draft, torch.nn.Module) else f"{type(draft).__name__}@{id(draft):x}"


def key_for(target, draft, lean: str = "auto") -> dict:
    """The calibration key of a (target, draft) pair on ``lean``'s path, on this machine and thread count."""
    target_id = model_identity(target) if isinstance(target, torch.nn.Module) else f"{type(target).__name__}@{id(target):x}"
    return calibration_key(target_id, lean_precision(target, lean) or "transformers", draft_identity(draft), cpu_build())


@functools.cache
def machine_rates(threads: int, repeats: int = 3) -> tuple[float, float]:
    """(GFLOP/s of a 1024^3 fp32 matrix product, GB/s of a sum over 128 MiB) on ``threads`` threads,
    measured once per process: what the target's pass is judged against."""
    a, b, x = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.ones(1 << 25)
    product, read = medians_in_turn([lambda: a @ b, x.sum], repeats)
    return 2 * 1024**3 / product / 1e9, x.numel() * 4 / read / 1e9


def calibrate(target, draft=None, lean: str = "auto", max_draft_tokens: int = 8, repeats: int = 3) -> Calibration:
    """Measure the costs of a loop over ``target`` and ``draft`` (as :func:`~specdec_fast.decoding.
    speculative.fast_generate` takes them; ``draft=None``: the target alone) on this machine; see the
    module docstring. ``repeats``: timed calls of each kind (after one untimed)."""
    target_lm, draft_lm = cached_pair(target, draft if draft is not None else PromptLookup(), lean)
    load_kernels(target_lm)
    start = time.perf_counter()  # the caches and the kernels are the loop's, built once whether calibrated or not
    one_target = OneSequence(target_lm)
    one_draft = draft_lm if isinstance(draft_lm, BatchedCachedLM) else OneSequence(draft_lm)
    vocab, k = target_lm.vocab_size, max(1, max_draft_tokens)
    period = [(7 * i + 3) % vocab for i in range(16)]  # a repeating text: a lookup finds every round's drafts
    sampling = SamplingParams(temperature=1.0)
    rounds, budget = {0: [], k: []}, (repeats + 1) * (k + 2)
    context = min(CONTEXT, target_lm.max_length - budget - k - 2) if target_lm.max_length is not None else CONTEXT
    if context < 1:
        raise ValueError(f"a context of {target_lm.max_length} tokens is too short to calibrate {k} drafts")
    ids = (period * (context // len(period) + 2))[: context + 1]
    seq = Request(list(ids), budget, torch.Generator().manual_seed(0), GenerationStats(prompt_tokens=len(ids)))
    target_lm.reset()
    one_draft.reset()
    prefill(one_target, one_draft, [seq])

    def passes(sizes: list[int]) -> dict[int, float]:
        """T(n) for n in sizes after the cached tokens: logits of every token, as a verification takes them."""
        held = target_lm.cache_length

        def one_pass(n: int) -> None:
            target_lm.extend(torch.tensor((period * (n // len(period) + 1))[:n]), n)
            target_lm.crop(held)

        return dict(zip(sizes, medians_in_turn([lambda n=n: one_pass(n) for n in sizes], repeats, 1)))

    short = passes(sorted({1, 2, 3, 5, k + 1}))
    lengths = [0, k] if draft is not None else [0]  # rounds as a generation runs them, plain and drafting in turn
    medians_in_turn([lambda n=n: rounds[n].append(speculative_round(one_target, one_draft if n else None, [seq], n, sampling,
                                                                     "token", set())) for n in lengths], repeats, 1)
    longer = min(CONTEXT * 2, target_lm.max_length - target_lm.cache_length - k - 1) if target_lm.max_length else CONTEXT * 2
    if longer > 0:  # a longer context
        target_lm.extend(torch.tensor((period * (longer // len(period) + 1))[:longer]), 1)
    pass_s = {context: short, target_lm.cache_length: passes([1, k + 1])}
    target_lm.reset()
    one_draft.reset()
    plain_s = statistics.median(r.draft_s + r.target_s for r in rounds[0][1:])
    draft_step_s = round_fixed_s = 0.0
    if draft is not None:
        drafted = rounds[k][1:]
        draft_step_s = statistics.median(r.draft_s / max(1, r.drafts.passes) for r in drafted)
        round_fixed_s = max(0.0, statistics.median(r.target_s - interpolate(short, max(r.drafts.lens) + 1) for r in drafted))
    key = key_for(target, draft, lean)
    gflops, gbps = machine_rates(torch.get_num_threads())
    extra = dict(max_draft_tokens=k)
    if isinstance(target_lm, LeanLM):  # what its pass reads and computes, for the pass's efficiency
        extra["pass_weights"], extra["pass_bytes"] = target_lm.lean.w.sizes()
    return Calibration(key, pass_s, plain_s, draft_step_s, round_fixed_s, gflops, gbps, time.perf_counter() - start, extra)


def calibration_for(target, draft=None, lean: str = "auto", max_draft_tokens: int = 8) -> Calibration | None:
    """The calibration of this (target, draft) loop on this machine: from this process, else from the
    user cache, else measured now and stored. None where the loop runs on a GPU (not calibrated)."""
    device = next(target.parameters()).device if isinstance(target, torch.nn.Module) else getattr(target, "device", None)
    if device is not None and torch.device(device).type != "cpu":
        return None
    key = key_for(target, draft, lean)
    name = json.dumps(key, sort_keys=True)
    if name not in _MEMORY:
        found = load_calibration(key)
        if found is None or found.extra.get("max_draft_tokens", 0) < max_draft_tokens:
            found = calibrate(target, draft, lean, max_draft_tokens)
            save_calibration(found)
        _MEMORY[name] = found
    return _MEMORY[name]


def drafted_at_most(policy: DraftPolicy, draft, num_draft_tokens: int) -> int:
    """The most tokens a round of this loop may draft: the policy's limit (``num_draft_tokens`` for a
    policy of another kind), or a hybrid's lookup allowance where that is more."""
    k = policy.max_length if isinstance(policy, SpeculativePolicy) else num_draft_tokens
    return min(MAX_CALIBRATED, max(k, draft.lookup.max_tokens if isinstance(draft, Hybrid) else 0, 1))


def loop_costs(target, draft, policy: DraftPolicy, lean: str, guard: bool, num_draft_tokens: int):
    """What a loop sets up from the costs measured where it runs: the calibration (stored, or
    measured now) handed to the policy and to a :class:`~specdec_fast.drafts.hybrid.Hybrid`'s
    chooser, which is made here when the hybrid has none and no ``rule`` (the shipped acceptance
    model of lookups, weighed by cost); returns (the draft, with that chooser, and the
    :class:`~specdec_fast.policies.guard.SpeculationGuard`, or None without ``guard``)."""
    calibration = calibration_for(target, draft, lean, drafted_at_most(policy, draft, num_draft_tokens))
    if isinstance(draft, Hybrid) and draft.chooser is None and not draft.rule:
        draft = dataclasses.replace(draft, chooser=default_sources())
    if isinstance(draft, Hybrid) and isinstance(draft.chooser, CostAwareSources):
        draft.chooser.use_calibration(calibration)
    policy.use_calibration(calibration)
    return draft, (SpeculationGuard(calibration) if guard else None)


def drafting_allowed(guard: SpeculationGuard | None, k: int, draft, rows: int = 1) -> tuple[int, bool]:
    """(the model's draft length this round, whether a hybrid may look up), from the policy's k: a
    hybrid's round may look up whatever its model's policy says (its chooser weighs each lookup),
    so it asks for at least one; the guard (if any) allows that, a one-token probe, or nothing."""
    asked = max(k, 1) if isinstance(draft, Hybrid) else k
    allowed = guard.allow(asked, rows) if guard is not None else asked
    return min(k, allowed), allowed > 0
