"""Soak run (``specdec-fast soak``): rounds of fast_generate on the default pair, cycling
through the held-out prompts (sampled, T=1, the shipped policy), with the process's
resident memory (RSS) read after warm-up and every 100 rounds. Memory must stay flat: no
cache, tensor or statistics list may grow with the number of rounds or requests."""

from __future__ import annotations

import os

from ..generate import fast_generate, warmup
from ..learned_policy import default_policy
from .common import machine, markdown_table, write_results
from .efficiency import EfficiencyBenchmark


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc)."""
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def run(rounds: int, out_name: str = "soak") -> dict:
    bench = EfficiencyBenchmark.default(None)
    warmup(bench.target, bench.draft)
    samples, done, request = [dict(rounds=0, rss_mb=rss_mb())], 0, 0
    while done < rounds:
        out = fast_generate(bench.target, bench.draft, bench.prompt_ids(request % len(bench.prompts)),
                            max_new_tokens=64, temperature=1.0, seed=request, policy=default_policy())
        request += 1
        before, done = done, done + out.stats.rounds
        if done // 100 > before // 100 or done >= rounds:
            samples.append(dict(rounds=done, rss_mb=rss_mb()))
    growth = samples[-1]["rss_mb"] / samples[0]["rss_mb"] - 1
    data = dict(machine=machine(), settings=dict(rounds=rounds), requests=request, samples=samples, growth=growth)
    write_results(out_name, data, table(data))
    return data


def table(data: dict) -> str:
    rows = [[s["rounds"], f"{s['rss_mb']:.1f}"] for s in data["samples"]]
    return (markdown_table(["rounds done", "RSS MB"], rows) +
            f"\n\n{data['requests']} requests; RSS growth after warm-up: {100 * data['growth']:+.2f}%.")
