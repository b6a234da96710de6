"""Skinny linear microbenchmark (``specdec-fast linear-bench``): F.linear (BLAS) against the
cpu backend's skinny kernel on SmolLM2-135M's weight shapes, for the row counts of a
verification pass, and the target pass they add up to (v(k) with and without it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cached_lm import HFCachedLM
from ..linear import MAX_ROWS, skinny_linear, use_skinny_linear
from .common import machine, markdown_table, median_time, write_results

SHAPES = {"q/o proj 576x576": (576, 576), "gate/up 1536x576": (1536, 576), "down 576x1536": (576, 1536),
          "lm_head 49152x576": (49152, 576)}
ROWS = (1, 2, 3, 5, 9)


def target_passes(model, rows: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Median seconds of a KV-cached pass over n tokens (cache of 64), per n."""
    lm = HFCachedLM(model)
    ids = torch.arange(1, 65) * 7 % model.config.vocab_size
    lm.extend(ids, 1)
    length = lm.cache_length

    def run(n: int):
        lm.extend(ids[:n], n)
        lm.crop(length)

    return {n: median_time(lambda: run(n), repeats) for n in rows}


def run(repeats: int, out_name: str = "linear") -> dict:
    from ..smollm2 import load_smollm2

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
    passes = {"blas": target_passes(target, ROWS, repeats)}
    passes["skinny"] = target_passes(use_skinny_linear(target), ROWS, repeats)
    model = [dict(tokens=m, **{f"{kind}_ms": p[m] * 1e3 for kind, p in passes.items()},
                  **{f"{kind}_v": p[m] / p[1] for kind, p in passes.items()}) for m in ROWS]
    data = dict(machine=machine(), settings=dict(repeats=repeats, max_rows=MAX_ROWS), ops=rows, target_pass=model)
    write_results(out_name, data, table(data))
    return data


def table(data: dict) -> str:
    ops = markdown_table(["weight", "rows", "F.linear ms", "skinny ms", "speedup", "skinny GB/s of weights"],
                         [[r["shape"], r["rows"], r["blas_ms"], r["skinny_ms"], r["speedup"], r["skinny_gbps"]]
                          for r in data["ops"]])
    passes = markdown_table(["tokens in the pass", "F.linear ms", "v (F.linear)", "skinny ms", "v (skinny)"],
                            [[r["tokens"], r["blas_ms"], r["blas_v"], r["skinny_ms"], r["skinny_v"]]
                             for r in data["target_pass"]])
    return ops + "\n\nSmolLM2-135M-Instruct target pass (KV cache of 64 tokens); v = time / one-token time:\n\n" + passes
