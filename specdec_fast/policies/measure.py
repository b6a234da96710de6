"""Measured costs: the pass timings a cost-aware policy's priors, and the benchmarks' cost
columns, are made of. Sizes are timed in turn (one call of each per repeat), so that a step in
the machine's speed reaches every size alike."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from ..models.lean import cached_lm


def medians_in_turn(fns: list[Callable[[], object]], repeats: int, warmup: int = 2) -> list[float]:
    """Median wall seconds of each of ``fns`` (CPU), called in turn, one call of each per repeat, so a
    change in the machine's speed reaches all of them alike (this VM's speed moves in steps: timed
    one after another, a 2-token target pass once measured 0.8x a 1-token pass)."""
    times = [[] for _ in fns]
    for repeat in range(warmup + repeats):
        for samples, fn in zip(times, fns):
            start = time.perf_counter()
            fn()
            if repeat >= warmup:
                samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def pass_medians(passes: list[tuple[object, int]], ids: list[int], repeats: int = 15, warmup: int = 2) -> list[float]:
    """Median seconds of each (model, n) of ``passes``: one pass over n tokens with the model's cache
    holding ``ids`` (cropped back each time), the passes timed in turn (:func:`medians_in_turn`).

    Models: transformers models or CachedLMs; list a feature draft after its target (it reads
    the target's features of ``ids``)."""
    held = {}  # id(model) -> (its CachedLM, the cache length holding ids)
    for model, _ in passes:
        if id(model) not in held:
            lm = cached_lm(model)
            lm.reset()
            lm.extend(torch.tensor(ids), 1)
            held[id(model)] = lm, lm.cache_length
    last = torch.tensor(ids[-1:])

    def one_pass(lm, length: int, n: int) -> None:
        lm.extend(last.repeat(n), n)
        lm.crop(length)

    return medians_in_turn([lambda h=held[id(model)], n=n: one_pass(*h, n) for model, n in passes], repeats, warmup)


def affine_fit(seconds: dict[int, float]) -> tuple[float, float]:
    """(intercept, slope) of T(n) = intercept + slope n through measured pass times, Theil-Sen (the
    median of the pairwise slopes): one noisy size, which this VM often gives, does not move it."""
    sizes = sorted(seconds)
    slope = statistics.median((seconds[j] - seconds[i]) / (j - i) for i in sizes for j in sizes if j > i)
    return statistics.median(seconds[n] - slope * n for n in sizes), slope


def step_costs(target, draft, ids: list[int], max_k: int, repeats: int = 15) -> dict:
    """Median one-token pass times and v(k) as measured, with both caches holding ``ids`` (the
    target's first: a feature draft reads its features); and ``target_fit_s``, the target's pass
    times over n = 1..max_k + 1 tokens (what cost models should use): T(1) as measured, T(n >= 2)
    from :func:`affine_fit` of the n >= 2 measurements. One line through all of them would
    understate the step from 1 to 2 tokens (transformers' one-token decode needs no attention
    mask; here v(1) measured 1.15-1.21 where a fit through n = 1..9 said 1.07)."""
    target_s, draft_s, *longer = pass_medians([(target, 1), (draft, 1)] + [(target, k + 1) for k in range(1, max_k + 1)],
                                             ids, repeats)
    many = dict(enumerate(longer, 2))  # passes over n >= 2 tokens
    verify = {n - 1: t / target_s for n, t in many.items()}
    if len(many) > 1:
        intercept, slope = affine_fit(many)
        many = {n: intercept + slope * n for n in many}
    return dict(target_step_s=target_s, draft_step_s=draft_s, c=draft_s / target_s, v=verify,
                target_fit_s={1: target_s} | many)
