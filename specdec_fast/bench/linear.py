"""Skinny linear microbenchmark (``specdec-fast linear-bench``): F.linear (BLAS) against the
cpu backend's skinny kernel on SmolLM2-135M's weight shapes, for the row counts of a
verification pass, and the target pass they add up to (v(k) with and without it, and with
packed GQA attention on top, at two cache lengths)."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.linear import MAX_ROWS, skinny_linear
from ..models.attention import NAME, use_packed_gqa
from ..models.cached_lm import HFCachedLM
from ..models.fast_passes import SkinnyLinear
from ..models.smollm2 import load_smollm2
from .common import machine, markdown_table, median_time, write_results

SHAPES = {"q/o proj 576x576": (576, 576), "gate/up 1536x576": (1536, 576), "down 576x1536": (576, 1536),
          "lm_head 49152x576": (49152, 576)}
ROWS = (1, 2, 3, 5, 9)
CACHED = (64, 512)


def _configure(model, skinny: bool, packed: bool) -> None:
    """Put ``model``'s linear layers and attention in one of the compared states, in place."""
    for module in model.modules():
        if type(module) in (nn.Linear, SkinnyLinear):
            module.__class__ = SkinnyLinear if skinny else nn.Linear
    model.set_attn_implementation(NAME if packed else "sdpa")


def target_passes(model, configs: dict[str, tuple[bool, bool]], repeats: int) -> dict[tuple[str, int, int], float]:
    """Median seconds of a KV-cached pass over n tokens after c cached tokens, per (config, c, n):
    every repeat runs every (config, c, n) once, in a shuffled order, so that the machine's
    drift over the run falls on all of them alike."""
    use_packed_gqa(model)  # registers the attention function
    caches = {}
    for c in CACHED:
        caches[c] = HFCachedLM(model)
        caches[c].extend(torch.arange(1, c + 1) * 7 % model.config.vocab_size, 1)
    ids = torch.arange(1, max(ROWS) + 1) * 11 % model.config.vocab_size
    cells = [(kind, c, n) for kind in configs for c in CACHED for n in ROWS]
    samples = {cell: [] for cell in cells}
    order = random.Random(0)
    for _ in range(repeats):
        order.shuffle(cells)
        for kind, c, n in cells:
            _configure(model, *configs[kind])
            lm, length = caches[c], caches[c].cache_length
            start = time.perf_counter()
            lm.extend(ids[:n], n)
            samples[kind, c, n].append(time.perf_counter() - start)
            lm.crop(length)
    return {cell: statistics.median(x) for cell, x in samples.items()}


def run(repeats: int, out: Path = Path("results/linear")) -> dict:
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k) / k**0.5
        for m in ROWS:
            x = torch.randn(m, k)
            blas = median_time(lambda: F.linear(x, w), repeats)
            skinny = median_time(lambda: skinny_linear(x, w, backend="cpu"), repeats)
            rows.append(dict(shape=name, rows=m, blas_ms=blas * 1e3, skinny_ms=skinny * 1e3, speedup=blas / skinny,
                             skinny_gbps=n * k * 4 / skinny / 1e9))
    target, _ = load_smollm2()
    configs = {"blas": (False, False), "skinny": (True, False), "packed": (True, True)}
    t = target_passes(target, configs, repeats)
    model = [dict(cached=c, tokens=m, **{f"{kind}_ms": t[kind, c, m] * 1e3 for kind in configs},
                  **{f"{kind}_v": t[kind, c, m] / t[kind, c, 1] for kind in configs}) for c in CACHED for m in ROWS]
    data = dict(machine=machine(), settings=dict(repeats=repeats, max_rows=MAX_ROWS), ops=rows, target_pass=model)
    write_results(out, data, table(data))
    return data


def table(data: dict) -> str:
    ops = markdown_table(["weight", "rows", "F.linear ms", "skinny ms", "speedup", "skinny GB/s of weights"],
                         [[r["shape"], r["rows"], r["blas_ms"], r["skinny_ms"], r["speedup"], r["skinny_gbps"]]
                          for r in data["ops"]])
    passes = markdown_table(["cached tokens", "tokens in the pass", "F.linear ms", "v (F.linear)", "skinny ms", "v (skinny)",
                             "skinny + packed GQA ms", "v (skinny + packed GQA)"],
                            [[r["cached"], r["tokens"], r["blas_ms"], r["blas_v"], r["skinny_ms"], r["skinny_v"],
                              r["packed_ms"], r["packed_v"]] for r in data["target_pass"]])
    return ops + "\n\nSmolLM2-135M-Instruct target pass after a KV cache of 64 or 512 tokens; v = time / one-token time:\n\n" + passes
