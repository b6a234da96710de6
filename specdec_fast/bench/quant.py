"""Quantized draft benchmark (``benchmarks/quant.py``, ``specdec-fast quant-bench``).

The shipped draft with int8 weights against the default fp32 one: torchao's int8
weight-only quantization (``Int8WeightOnlyConfig``), and torch's dynamic int8
quantization (``torch.ao.quantization.quantize_dynamic``, deprecated in torch 2.10+, kept
for comparison). Both quantize the draft's decoder layers (``nn.Linear``); the restricted
LM head stays fp32 (skinny kernel). For each variant: the draft step cost c (one-token
draft pass / one-token target pass) and, on held-out prompts side by side with the target
alone (each run right after its own run of the target alone), acceptance and tokens/s of
``fast_generate`` at a fixed draft length.
"""

from __future__ import annotations

import warnings

import torch

from ..generate import fast_generate, generate_autoregressive, warmup
from ..drafts import default_draft
from .common import machine, markdown_table, write_results
from .e2e import pass_seconds
from .efficiency import EfficiencyBenchmark, plot_speedups


def int8_torchao(draft: torch.nn.Module) -> torch.nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(draft, Int8WeightOnlyConfig())
    return draft


def int8_dynamic(draft: torch.nn.Module) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of torchao
        return torch.ao.quantization.quantize_dynamic(draft, {torch.nn.Linear}, dtype=torch.qint8)


def run(num_prompts: int, k: int, temperatures: list[float], max_new_tokens: int, out_name: str = "quant") -> dict:
    bench = EfficiencyBenchmark.default(num_prompts, max_new_tokens=max_new_tokens, temperatures=tuple(temperatures))
    target = bench.target
    drafts = {"fp32": bench.draft, "int8 torchao": int8_torchao(default_draft(target)),
              "int8 dynamic": int8_dynamic(default_draft(target))}
    for draft in drafts.values():
        warmup(target, draft)
    ids = bench.prompt_ids(0)
    target_s = pass_seconds(target, ids)
    costs = {name: pass_seconds(d, ids) / target_s for name, d in drafts.items()}

    methods = {"target alone": lambda p, s: dict(tps=generate_autoregressive(target, p, **s).stats.tokens_per_second)}
    for name, draft in drafts.items():
        def method(p, s, draft=draft):
            st = fast_generate(target, draft, p, num_draft_tokens=k, **s).stats
            return dict(tps=st.tokens_per_second, acceptance=st.acceptance_rate)
        methods[f"{name} k={k}"] = method
    runs = bench.run(methods, "target alone", desc="prompts")
    summary = EfficiencyBenchmark.compare_with_baseline(runs, "target alone")
    data = dict(machine=machine(), settings=dict(prompts=len(bench.prompts), k=k, temperatures=temperatures,
                                                 max_new_tokens=max_new_tokens),
                target_step_s=target_s, c=costs, runs=runs, summary=summary)
    write_results(out_name, data, table(data))
    plot_speedups(summary, out_name, "draft weights")
    return data


def table(data: dict) -> str:
    c = data["c"]
    rows = [[s["temperature"], s["method"], f"{s['tps']:.1f}", f"{s['speedup']:.3f}",
             f"{s['acceptance']:.3f}" if "acceptance" in s else "-"] for s in data["summary"]]
    costs = ", ".join(f"{name} {value:.3f}" for name, value in c.items())
    return (markdown_table(["T", "method", "tok/s", "speedup vs target", "acceptance"], rows) +
            f"\n\nMedians over {data['settings']['prompts']} held-out prompts, {data['settings']['max_new_tokens']} tokens. "
            f"Draft step cost c (one-token pass / target's {data['target_step_s'] * 1e3:.1f} ms): {costs}.")
