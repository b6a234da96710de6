"""First-token alternatives, paired against the same loop without them (``benchmarks/alternatives.py``,
``specdec-fast alternatives-bench``).

On held-out prompts, with the shipped feature draft, for each setting (fixed draft lengths and the
shipped learned draft-length policy, the main job's) and temperature: every run with ``a``
alternatives right after a run of the same setting without them, same seed, so each ratio compares
two runs made seconds apart. Medians over prompts of tokens/s, of the paired ratio, of tokens per
round (new tokens / target verification passes) and of the share of rounds an alternative won.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ..decoding import fast_generate, warmup
from ..policies.shipped import POLICY_FILES, default_policy
from .common import machine, markdown_table, write_results
from .efficiency import EfficiencyBenchmark


def run(num_prompts: int | None, lengths: list[int], counts: list[int], temperatures: list[float],
        max_new_tokens: int, out: Path = Path("results/alternatives")) -> dict:
    bench = EfficiencyBenchmark.default(num_prompts, draft="feature", max_new_tokens=max_new_tokens,
                                        temperatures=temperatures)
    warmup(bench.target, bench.draft, num_alternatives=max(counts))

    def method(k: int | None, a: int):
        def generate(ids, settings):
            policy = default_policy("token", POLICY_FILES["feature"]) if k is None else None  # fresh per run
            s = fast_generate(bench.target, bench.draft, ids, num_draft_tokens=k or 1, policy=policy,
                              num_alternatives=a, guard=k is None, **settings).stats
            return dict(alternatives=a, tps=s.tokens_per_second, accepted_length=s.mean_accepted_length,
                        alternative_wins=s.alternatives_accepted / max(s.rounds, 1), pass_s=s.target_pass_s)
        return generate

    summary, runs = [], []
    for k in [*lengths, None]:
        setting = "learned policy" if k is None else f"feature k={k}"
        methods = {setting: method(k, 0)} | {f"{setting} +{a} alt": method(k, a) for a in counts}
        mine = bench.run(methods, setting, desc=setting)
        summary += [s for s in EfficiencyBenchmark.compare_with_baseline(mine, setting) if s["method"] != setting]
        runs += mine
    data = dict(machine=machine(), settings=dict(prompts=len(bench.prompts), lengths=lengths, alternatives=counts,
                                                temperatures=temperatures, max_new_tokens=max_new_tokens),
                summary=summary, runs=runs)
    write_results(out, data, table(data))
    return data


def table(data: dict) -> str:
    """Per (temperature, setting with alternatives): the paired medians, and those of the runs without."""
    base = {}
    for r in data["runs"]:
        if not r["alternatives"]:
            base.setdefault((r["temperature"], r["method"]), []).append(r)
    rows = []
    for s in data["summary"]:
        setting = s["method"].rsplit(" +", 1)[0]
        without = base[s["temperature"], setting]
        rows.append([f"{s['temperature']:g}", s["method"], s["tps"], s["speedup"], s["accepted_length"],
                     statistics.median([r["accepted_length"] for r in without]), s["alternative_wins"], s["pass_s"] * 1e3,
                     statistics.median([r["pass_s"] for r in without]) * 1e3])
    head = ["T", "method", "tok/s", "speedup vs the same without alternatives", "tokens/round",
            "tokens/round without", "rounds won by an alternative", "target pass ms", "target pass ms without"]
    return markdown_table(head, rows)

