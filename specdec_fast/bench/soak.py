"""Soak run (``specdec-fast soak``): rounds of fast_generate (the shipped policy), then rounds
of batch_generate (batches of 4, draft length 2), on the default pair, cycling through the
held-out prompts (sampled, T=1), with the process's resident memory (RSS) read after
warm-up and every 100 rounds. Memory must stay flat: no
cache, tensor or statistics list may grow with the number of rounds or requests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..decoding import batch_generate, fast_generate, warmup
from ..policies.shipped import default_policy
from .common import machine, markdown_table, write_results
from .efficiency import EfficiencyBenchmark


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc)."""
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def soak(request: Callable[[int], int], rounds: int) -> dict:
    """Call ``request(i)`` (one request or batch; returns its rounds) for i = 0, 1, ... until
    ``rounds`` rounds are done; RSS before the first and every 100 rounds."""
    samples, done, i = [dict(rounds=0, rss_mb=rss_mb())], 0, 0
    while done < rounds:
        before, done = done, done + request(i)
        i += 1
        if done // 100 > before // 100 or done >= rounds:
            samples.append(dict(rounds=done, rss_mb=rss_mb()))
    return dict(requests=i, samples=samples, growth=samples[-1]["rss_mb"] / samples[0]["rss_mb"] - 1)


def run(rounds: int, batch: int = 4, out: Path = Path("results/soak")) -> dict:
    bench = EfficiencyBenchmark.default(None)
    target, draft, n = bench.target, bench.draft, len(bench.prompts)
    warmup(target, draft)

    def single(i: int) -> int:
        out = fast_generate(target, draft, bench.prompt_ids(i % n), max_new_tokens=64, temperature=1.0, seed=i,
                            policy=default_policy())
        return out.stats.rounds

    def batched(i: int) -> int:
        ids = [bench.prompt_ids((batch * i + j) % n) for j in range(batch)]
        out = batch_generate(target, draft, input_ids=ids, max_new_tokens=64, temperature=1.0, num_draft_tokens=2,
                             seeds=[batch * i + j for j in range(batch)])
        return len(out.draft_lengths)

    batched(0)  # the batched loop's warm-up
    data = dict(machine=machine(), settings=dict(rounds=rounds, batch=batch),
                fast_generate=soak(single, rounds), batch_generate=soak(batched, rounds))
    write_results(out, data, table(data))
    return data


def table(data: dict) -> str:
    parts = []
    for name in ("fast_generate", "batch_generate"):
        d = data[name]
        rows = [[s["rounds"], f"{s['rss_mb']:.1f}"] for s in d["samples"]]
        unit = "requests" if name == "fast_generate" else f"batches of {data['settings']['batch']}"
        parts.append(f"{name}:\n\n" + markdown_table(["rounds done", "RSS MB"], rows) +
                     f"\n\n{d['requests']} {unit}; RSS growth after warm-up: {100 * d['growth']:+.2f}%.")
    return "\n\n".join(parts)
