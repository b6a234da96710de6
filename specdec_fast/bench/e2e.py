"""End-to-end benchmark on the default pair (``benchmarks/e2e.py``, ``specdec-fast bench``).

On the held-out prompts, side by side per prompt, each run right after its own run of (a)
the target alone, KV-cached: (b) transformers' assisted generation with the same draft;
(c) fast_generate with fixed draft lengths (with the feature draft, optionally also with
first-token alternatives); and (a) again, an A/A control. For each chain-only
length, the Leviathan prediction E[N] / (k c + v(k)) with E[N] = (1 - a^(k+1)) / (1 - a)
from the measured acceptance rate a, the cost ratio c (draft step / one-token target pass)
and verify cost v(k) ((k+1)-token target pass / one-token pass) as timed inside the runs,
against which the measured speedup is set; and, for reference, the same prediction from
passes timed in isolation before the runs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ..decoding import fast_generate, generate_autoregressive
from ..drafts.feature_lm import feature_pair
from ..drafts.shipped import default_feature_draft
from ..models.fast_passes import use_fast_passes
from ..policies.costs import expected_tokens
from ..policies.measure import step_costs
from .common import machine, markdown_table, pyplot, save_figure, write_results
from .efficiency import EfficiencyBenchmark


def _hf_assisted(target, draft, ids: list[int], temperature: float, max_new_tokens: int) -> float:
    """tokens/s of ``target.generate(assistant_model=draft)`` with transformers' default schedule."""
    x = torch.tensor([ids])
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    start = time.perf_counter()
    out = target.generate(x, attention_mask=torch.ones_like(x), assistant_model=draft, max_new_tokens=max_new_tokens,
                          min_new_tokens=max_new_tokens, **sampling)
    return (out.shape[1] - len(ids)) / (time.perf_counter() - start)


def run(num_prompts: int | None, lengths: list[int], feature_lengths: list[int], temperatures: list[float],
        max_new_tokens: int, out: Path = Path("results/e2e"), alternatives: tuple[int, ...] = ()) -> dict:
    """``alternatives``: for each count a and each feature length k, a row "feature k=K +a alt"."""
    bench = EfficiencyBenchmark.default(num_prompts, max_new_tokens=max_new_tokens, temperatures=temperatures)
    target, draft = bench.target, bench.draft
    feature = feature_pair(target, use_fast_passes(default_feature_draft(target)))
    ids = bench.prompt_ids(0)
    costs = step_costs(target, draft, ids, max(lengths + feature_lengths))  # isolated passes, for reference
    costs["c_feature"] = step_costs(*feature, ids, 1)["c"]

    def speculative(pair, k: int, a: int = 0):
        def method(ids, settings):
            s = fast_generate(*pair, ids, num_draft_tokens=k, num_alternatives=a, guard=False, **settings).stats
            return dict(k=k, alternatives=a, tps=s.tokens_per_second, acceptance=s.acceptance_rate,
                        accepted_length=s.mean_accepted_length, per_position=s.per_position_acceptance,
                        pass_s=s.target_pass_s, draft_token_s=s.draft_s / max(s.drafted, 1),
                        alternative_wins=s.alternatives_accepted / max(s.rounds, 1))
        return method

    def alone(ids, settings):
        s = generate_autoregressive(target, ids, **settings).stats
        return dict(tps=s.tokens_per_second, pass_s=s.target_pass_s)

    methods = {
        "target": alone,
        "target again": alone,  # A/A control: what a ratio of identical work measures on this machine
        "hf_assisted": lambda ids, settings: dict(tps=_hf_assisted(target, draft, ids, settings["temperature"], max_new_tokens)),
    } | {f"k={k}": speculative((target, draft), k) for k in lengths} | {
        f"feature k={k}": speculative(feature, k) for k in feature_lengths} | {
        f"feature k={k} +{a} alt": speculative(feature, k, a) for a in alternatives for k in feature_lengths}
    runs = bench.run(methods, "target", desc="e2e prompts")
    summary = summarize(runs, costs)
    data = dict(machine=machine(), settings=dict(prompts=len(bench.prompts), max_new_tokens=max_new_tokens,
                                                lengths=lengths, feature_lengths=feature_lengths, temperatures=temperatures,
                                                alternatives=list(alternatives)),
                costs=costs, summary=summary, runs=runs)
    write_results(out, data, table(summary, costs))
    plot(summary, out)
    return data


def summarize(runs: list[dict], costs: dict) -> list[dict]:
    """Medians over prompts per (temperature, method), speedups over the target as medians of
    per-prompt ratios to the paired target run, over transformers' assisted generation as the
    ratio of the two speedups, and the Leviathan prediction per length, twice: from the costs
    timed inside each run ("predicted": c and v(k) as the loop met them, per drafted token and
    per verification pass, over the paired target run's one-token pass; what it leaves out is
    the loop's own overhead) and from step_costs' isolated passes ("predicted_isolated"); rows
    with alternatives, which that prediction does not model, get none."""
    summary = EfficiencyBenchmark.compare_with_baseline(runs, "target")
    hf = {s["temperature"]: s["speedup"] for s in summary if s["method"] == "hf_assisted"}
    one_token = {(r["pair"], r["temperature"]): r["pass_s"] for r in runs if r["method"] == "target"}
    for entry in summary:
        entry["vs_hf"] = entry["speedup"] / hf[entry["temperature"]]
        if "k" in entry and not entry["alternatives"]:
            k = entry["k"]
            mine = [r for r in runs if r["method"] == entry["method"] and r["temperature"] == entry["temperature"]]
            loop = [(r["draft_token_s"] / one_token[r["pair"], r["temperature"]],
                     r["pass_s"] / one_token[r["pair"], r["temperature"]], r["acceptance"]) for r in mine]
            entry["c_loop"] = statistics.median(c for c, _, _ in loop)
            entry["v_loop"] = statistics.median(v for _, v, _ in loop)
            entry["predicted"] = statistics.median(expected_tokens(a, k) / (k * c + v) for c, v, a in loop)
            entry["efficiency"] = entry["speedup"] / entry["predicted"]
            c = costs["c_feature"] if entry["method"].startswith("feature") else costs["c"]
            entry["predicted_isolated"] = expected_tokens(entry["acceptance"], k) / (k * c + costs["v"][k])
            positions = list(zip(*[r["per_position"] for r in mine if len(r["per_position"]) == k]))
            entry["per_position"] = [statistics.median(p) for p in positions]
    return summary


def table(summary: list[dict], costs: dict) -> str:
    rows = [[f"{s['temperature']:g}", s["method"], s["tps"], s["speedup"], s["vs_hf"], s.get("acceptance", "-"),
             s.get("accepted_length", "-"), s.get("c_loop", "-"), s.get("v_loop", "-"), s.get("predicted", "-"),
             s.get("efficiency", "-"), s.get("predicted_isolated", "-"), s.get("alternative_wins", "-")] for s in summary]
    head = ["T", "method", "tok/s", "speedup vs target", "vs HF assisted", "acceptance (chain)", "tokens/round",
            "c in loop", "v(k) in loop", "Leviathan prediction (loop costs)", "measured/predicted",
            "prediction (isolated passes)", "rounds won by an alternative"]
    v = ", ".join(f"v({k})={x:.2f}" for k, x in costs["v"].items())
    return (markdown_table(head, rows) + f"\n\nIsolated passes (step_costs, before the runs): target pass {costs['target_step_s'] * 1e3:.1f} ms, draft pass "
            f"{costs['draft_step_s'] * 1e3:.1f} ms, c = {costs['c']:.3f} (token draft), "
            f"{costs['c_feature']:.3f} (feature draft); {v}.")


def plot(summary: list[dict], out: Path) -> None:
    """Measured speedup by draft length, one panel per temperature: one colour per draft, each
    draft's Leviathan prediction in black dots with a marker of its own, transformers' assisted
    generation dashed."""
    plt = pyplot()
    temperatures = sorted({s["temperature"] for s in summary})
    fig, axes = plt.subplots(1, len(temperatures), figsize=(6 * len(temperatures), 4.2), squeeze=False, sharey=True)
    counts = sorted({s["alternatives"] for s in summary if s.get("alternatives")})
    series = [("token draft", "k=", 0, "tab:blue", "o-", "x:"), ("feature draft", "feature k=", 0, "tab:orange", "s-", "+:")] + [
        (f"feature draft +{a} alternatives", "feature k=", a, "tab:green", "^-", None) for a in counts]
    for ax, temperature in zip(axes[0], temperatures):
        for label, prefix, a, color, style, predicted in series:
            ks = [s for s in summary if s["temperature"] == temperature and s["method"].startswith(prefix)
                  and s["alternatives"] == a]
            if not ks:
                continue
            ax.plot([s["k"] for s in ks], [s["speedup"] for s in ks], style, color=color, label=label)
            if predicted:
                ax.plot([s["k"] for s in ks], [s["predicted"] for s in ks], predicted, color="black", alpha=0.7,
                        markersize=8, label=f"{label}: Leviathan prediction (loop costs)")
        hf = next(s for s in summary if s["temperature"] == temperature and s["method"] == "hf_assisted")
        ax.axhline(hf["speedup"], color="tab:purple", linestyle="--", label="transformers assisted generation")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(xlabel="draft length k", title=f"T = {temperature:g}")
    axes[0][0].set_ylabel("speedup over the target alone (median)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("SmolLM2-135M-Instruct + distilled drafts, 2-core CPU", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, out, dpi=120)
    plt.close(fig)
