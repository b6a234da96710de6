"""Batched speculative decoding benchmark (``benchmarks/batch.py``, ``specdec-fast batch-bench``).

For each batch size B, the first B held-out prompts run as one batch, side by side in
each repeat: batch_generate with the shipped draft of one kind (feature or token) at fixed
draft lengths and with that draft's shipped cost-aware policy,
each run right after its own run of batched autoregressive decoding of the target (the
baseline), because this VM's speed drifts within a repeat (a baseline run after the k = 4
runs measured 5-15% slower than one before them). Speedups are medians over repeats of
the ratio to the paired baseline run; a second autoregressive run, paired like the others,
shows what a ratio of identical work measures. The batched pass costs explain
the result: T_B(n), a target pass over B rows of n tokens; v_B(k) = T_B(k+1) / T_B(1);
c_B, a draft step over B rows / T_B(1); the Leviathan prediction for length k is
E[N] / (k c_B + v_B(k)) with the acceptance measured at that length.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from ..decoding import batch_generate, warmup
from ..drafts.binding import batched_pair
from ..models.batched_lm import BatchedLM, right_aligned
from ..policies.costs import expected_tokens
from ..policies.measure import medians_in_turn
from ..policies.shipped import POLICY_FILES, default_policy
from .common import machine, markdown_table, pyplot, save_figure, write_results
from .efficiency import EfficiencyBenchmark, paired_order

BASELINE = "autoregressive"


def pass_costs(target, draft, prompts: list[list[int]], max_k: int, repeats: int = 7) -> dict:
    """Median seconds of a target pass over B rows x n tokens (n = 1..max_k+1) and of a draft
    step over B rows, with each model's cache holding the B prompts, timed in turn."""
    t, d = batched_pair(target, draft, len(prompts))
    tokens, fed = right_aligned(prompts)
    t.extend(tokens, fed, 1)
    d.extend(tokens, fed, 1)
    lengths, last = t.lengths, tokens[:, -1:]

    def one_pass(lm: BatchedLM, n: int):
        lm.extend(last.repeat(1, n), torch.ones(len(prompts), n, dtype=torch.bool), n)
        lm.keep(lengths)

    sizes = range(1, max_k + 2)
    *target_s, draft_s = medians_in_turn([lambda n=n: one_pass(t, n) for n in sizes] + [lambda: one_pass(d, 1)], repeats)
    return dict(target_s=dict(zip(sizes, target_s)), draft_s=draft_s)


def run(batches: list[int], lengths: list[int], temperatures: list[float], max_new_tokens: int, repeats: int,
        draft_kind: str = "feature", out: Path | None = None) -> dict:
    """Writes ``out``.{json,md,png} (default results/batch_<draft_kind>)."""
    bench = EfficiencyBenchmark.default(None, draft_kind, models=True)
    target, draft = bench.target, bench.draft
    warmup(target, draft)
    settings = dict(max_new_tokens=max_new_tokens, eos_token_id=())
    baseline = lambda ids, seeds, t: batch_generate(target, None, input_ids=ids, temperature=t, seeds=seeds, **settings)
    methods = {BASELINE: baseline}
    for k in lengths:
        methods[f"k={k}"] = lambda ids, seeds, t, k=k: batch_generate(target, draft, input_ids=ids, temperature=t, seeds=seeds,
                                                                       num_draft_tokens=k, guard=False, **settings)
    methods["autoregressive again"] = baseline  # A/A control: the noise and order bias of a pair
    methods["cost-aware"] = lambda ids, seeds, t: batch_generate(target, draft, input_ids=ids, temperature=t, seeds=seeds,
                                                                 policy=default_policy(path=POLICY_FILES[draft_kind]), **settings)
    results = []
    for batch in tqdm(batches, desc="batch sizes"):
        prompts = [bench.prompt_ids(i) for i in range(batch)]
        costs = pass_costs(target, draft, prompts, max(lengths))
        runs = []
        for repeat in range(repeats):
            for temperature in temperatures:
                seeds = [repeat * batch + i for i in range(batch)]
                for name, label in paired_order(methods, BASELINE):
                    out = methods[label](prompts, seeds, temperature)
                    drafted = sum(o.stats.drafted for o in out.outputs)
                    runs.append(dict(prompt=repeat, pair=f"{repeat}/{name}", temperature=temperature, method=label, verifier="-",
                                     tps=out.tokens_per_second,
                                     acceptance=sum(o.stats.accepted for o in out.outputs) / drafted if drafted else 0.0,
                                     mean_k=statistics.mean(out.draft_lengths)))
        summary = EfficiencyBenchmark.compare_with_baseline(runs, BASELINE)
        t1 = costs["target_s"][1]
        for s in summary:
            k = s["mean_k"]
            if s["method"].startswith("k="):
                k = int(s["method"][2:])
                s["predicted"] = expected_tokens(s["acceptance"], k) / (k * costs["draft_s"] / t1 + costs["target_s"][k + 1] / t1)
        results.append(dict(batch=batch, costs=costs, runs=runs, summary=summary))
    data = dict(machine=machine(), settings=dict(draft=draft_kind, batches=batches, lengths=lengths, temperatures=temperatures,
                                                 max_new_tokens=max_new_tokens, repeats=repeats),
                results=results, crossover=crossover(results, temperatures))
    out = out or Path(f"results/batch_{draft_kind}")
    write_results(out, data, table(data))
    plot(data, out)
    return data


def crossover(results: list[dict], temperatures: list[float]) -> dict:
    """Per temperature: the smallest B at which no fixed draft length beats the baseline (None: none)."""
    out = {}
    for temperature in temperatures:
        losing = [r["batch"] for r in results
                  if max(s["speedup"] for s in r["summary"] if s["temperature"] == temperature and s["method"].startswith("k=")) < 1.0]
        out[str(temperature)] = min(losing) if losing else None
    return out


def table(data: dict) -> str:
    names = [s["method"] for s in data["results"][0]["summary"] if s["temperature"] == data["settings"]["temperatures"][0]]
    rows = []
    for temperature in data["settings"]["temperatures"]:
        for r in data["results"]:
            by = {s["method"]: s for s in r["summary"] if s["temperature"] == temperature}
            cells = [f"{by[BASELINE]['tps']:.1f}"]
            for name in names[1:]:
                s = by[name]
                extra = f" (pred {s['predicted']:.2f})" if "predicted" in s else f" (mean k {s['mean_k']:.2f})"
                cells.append(f"{s['speedup']:.2f}x, a={s['acceptance']:.2f}{extra}")
            rows.append([temperature, r["batch"], *cells])
    speed = markdown_table(["T", "B", "autoregressive tok/s", *names[1:]], rows)
    cost_rows = []
    for r in data["results"]:
        t = {int(n): s for n, s in r["costs"]["target_s"].items()}
        cost_rows.append([r["batch"], f"{t[1] * 1e3:.1f}", *(f"{t[n] / t[1]:.2f}" for n in sorted(t) if n > 1),
                          f"{r['costs']['draft_s'] / t[1]:.3f}"])
    ks = sorted(int(n) - 1 for n in data["results"][0]["costs"]["target_s"] if int(n) > 1)
    costs = markdown_table(["B", "T_B(1) ms", *(f"v_B({k})" for k in ks), "c_B"], cost_rows)
    cross = ", ".join(f"T={t}: {'B=' + str(b) if b else 'none up to B=' + str(data['settings']['batches'][-1])}"
                      for t, b in data["crossover"].items())
    return (f"{speed}\n\nSpeedup: median over {data['settings']['repeats']} repeats of tokens/s over batched autoregressive "
            f"decoding run just before (autoregressive tok/s: median of those runs); a = acceptance rate; pred = Leviathan prediction from a, c_B, v_B(k).\n\n{costs}\n\n"
            f"Crossover (smallest B where no fixed draft length beats autoregressive): {cross}.")


def plot(data: dict, out: Path) -> None:
    """Speedup over batched autoregressive decoding vs batch size, per method, one panel per temperature."""
    plt = pyplot()
    temperatures = data["settings"]["temperatures"]
    fig, axes = plt.subplots(1, len(temperatures), figsize=(6 * len(temperatures), 4.5), squeeze=False)
    batches = [r["batch"] for r in data["results"]]
    for ax, temperature in zip(axes[0], temperatures):
        methods = [s["method"] for s in data["results"][0]["summary"] if s["temperature"] == temperature and s["method"] != BASELINE]
        for method in methods:
            ax.plot(batches, [next(s["speedup"] for s in r["summary"] if s["temperature"] == temperature and s["method"] == method)
                              for r in data["results"]], marker="o", label=method)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(xscale="log", xticks=batches, xticklabels=[str(b) for b in batches], xlabel="batch size B",
               ylabel="speedup over batched autoregressive", title=f"T = {temperature:g}")
        ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)
