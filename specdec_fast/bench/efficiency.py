"""``EfficiencyBenchmark`` (the seed's name): the engine under ``benchmarks/e2e.py`` and
``benchmarks/policies.py``.

It runs decoding methods over a prompt set side by side: for each prompt and temperature
every method runs right after its own run of the baseline method, so each ratio compares two
runs made seconds apart on the same machine state (this VM's speed drifts within a burst of
runs: a baseline run once before a fixed sequence of methods measured the later ones 5-15%
slow). :meth:`compare_with_baseline` reduces the runs to medians over prompts, with speedups
as medians of per-prompt ratios to the paired baseline run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tqdm import tqdm

from ..data.prompts import heldout_prompts
from ..decoding.requests import chat_prompt_ids
from ..drafts.shipped import load_pair
from .common import pyplot, save_figure

# A method: (prompt ids, settings {max_new_tokens, temperature, seed, eos_token_id}) -> metrics,
# at least {"tps": tokens per second}; "method" and "verifier" entries override the row's labels.
Method = Callable[[list[int], dict], dict]

# metric -> the name of its median ratio to the paired baseline run
RATIOS = {"tps": "speedup", "modelled_tps": "modelled_speedup"}


def paired_order(methods: dict, baseline: str) -> list[tuple[str, str]]:
    """The run order (pair, method label): every method other than ``baseline`` right after a
    run of ``baseline``, both in the pair named after the method."""
    return [(name, label) for name in methods if name != baseline for label in (baseline, name)]


@dataclass
class EfficiencyBenchmark:
    """Methods x prompts x temperatures on one target/draft pair (the draft is the methods' business)."""

    target: object
    draft: object
    tokenizer: object
    prompts: list[dict]  # [{"kind": str, "prompt": str}]
    max_new_tokens: int = 128
    temperatures: Sequence[float] = (0.0, 1.0)

    @classmethod
    def default(cls, num_prompts: int | None, draft: str = "token", models: bool = False, **settings) -> "EfficiencyBenchmark":
        """The SmolLM2 pair with the shipped ``draft`` (:func:`~specdec_fast.smollm2.load_pair`: "token",
        transformers models; "feature", bound CachedLMs, or the models if ``models``) and an evenly
        spaced subset of the held-out prompts (every kind of prompt stays in)."""
        target, draft, tokenizer = load_pair(draft, models)
        prompts = heldout_prompts()
        if num_prompts:
            prompts = prompts[:: -(-len(prompts) // num_prompts)]
        return cls(target, draft, tokenizer, prompts, **settings)

    def prompt_ids(self, index: int) -> list[int]:
        return chat_prompt_ids(self.tokenizer, self.prompts[index]["prompt"], chat=True)

    def run(self, methods: dict[str, Method], baseline: str, desc: str = "prompts") -> list[dict]:
        """Rows of labels and metrics: per (prompt, temperature), for each method other than
        ``baseline`` (a key of ``methods``), a run of the baseline, then one of the method, both
        labelled pair = "<prompt>/<method>". Greedy and sampled runs use seed = prompt index and
        generate exactly max_new_tokens (EOS off)."""
        runs = []
        for i, p in enumerate(tqdm(self.prompts, desc=desc)):
            ids = self.prompt_ids(i)
            for temperature in self.temperatures:
                settings = dict(max_new_tokens=self.max_new_tokens, temperature=temperature, seed=i, eos_token_id=())
                for name, label in paired_order(methods, baseline):
                    runs.append(dict(dict(prompt=i, pair=f"{i}/{name}", kind=p["kind"], temperature=temperature,
                                          method=label, verifier="-"), **methods[label](ids, settings)))
        return runs

    @staticmethod
    def compare_with_baseline(runs: list[dict], baseline: str) -> list[dict]:
        """Per (temperature, verifier, method), in order of appearance: the median over runs of
        every numeric metric, and for each metric of ``RATIOS`` a run reports (not None), the median
        over runs of its ratio to the baseline run with the same ``pair`` label and temperature
        (``speedup`` from tps, ``modelled_speedup`` from modelled_tps)."""
        base = {(r["pair"], r["temperature"]): r for r in runs if r["method"] == baseline}
        groups: dict[tuple, list[dict]] = {}
        for r in runs:
            groups.setdefault((r["temperature"], r["verifier"], r["method"]), []).append(r)
        summary = []
        for (temperature, verifier, method), rows in groups.items():
            numeric = [key for key, value in rows[0].items()
                       if isinstance(value, (int, float)) and key not in ("prompt", "temperature")]
            entry = dict(temperature=temperature, verifier=verifier, method=method)
            entry |= {key: statistics.median(r[key] for r in rows) for key in numeric}
            for key, ratio in RATIOS.items():
                values = [r[key] / base[r["pair"], r["temperature"]][key] for r in rows if r.get(key) is not None]
                if values:
                    entry[ratio] = statistics.median(values)
            summary.append(entry)
        return summary


def plot_speedups(summary: list[dict], out: Path, title: str, ratio: str = "speedup") -> None:
    """Bars of each method's median ``ratio`` (a value of ``RATIOS``) over the baseline, one panel
    per temperature, each bar labelled with its value, the axis spanning the values (not from 0,
    so a 5% difference shows), as ``out``.png."""
    plt = pyplot()
    temperatures = sorted({s["temperature"] for s in summary})
    most = max(sum(1 for s in summary if s["temperature"] == t and ratio in s) for t in temperatures)
    fig, axes = plt.subplots(1, len(temperatures), figsize=(7.5 * len(temperatures), 1.2 + 0.32 * most), squeeze=False)
    colors = {"-": "tab:gray", "token": "tab:blue", "block": "tab:orange"}
    for ax, temperature in zip(axes[0], temperatures):
        rows = [s for s in summary if s["temperature"] == temperature and ratio in s]
        values = [s[ratio] for s in rows]
        bars = ax.barh([s["method"] if s["verifier"] == "-" else f"{s['method']} ({s['verifier']})" for s in rows],
                       values, color=[colors.get(s["verifier"], "tab:green") for s in rows])
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
        lo, hi = min(values + [1.0]), max(values + [1.0])
        ax.set_xlim(lo - 0.15 * (hi - lo) - 0.02, hi + 0.15 * (hi - lo) + 0.05)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
        ax.set(xlabel=f"{ratio.replace('_', ' ')} over the baseline (median over prompts)",
               title=f"{title}, T = {temperature:g}")
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)
