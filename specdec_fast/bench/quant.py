"""Quantized draft benchmark (``benchmarks/quant.py``, ``specdec-fast quant-bench``).

The shipped draft (feature or token) with int8 weights against the default fp32 one
(skinny kernel): the ``cpu`` backend's int8 skinny kernel (``use_int8_weights``: every
linear layer and the restricted LM head, one scale per output row), torchao's int8
weight-only quantization (``Int8WeightOnlyConfig``, where torchao is installed) and torch's
dynamic int8 quantization (``quantize_dynamic``, deprecated in torch 2.10+, kept for
comparison); the last two quantize the ``nn.Linear`` layers and leave the restricted head
fp32. For each variant: the draft step cost c (one-token draft pass / one-token target
pass) and, on held-out prompts side by side with the target alone (each run right after
its own run of the target alone), acceptance and tokens/s of ``fast_generate`` at a fixed
draft length.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import torch

from ..decoding import fast_generate, generate_autoregressive, warmup
from ..drafts.feature_lm import FeatureDraftLM
from ..drafts.shipped import default_draft, default_feature_draft
from ..models.attention import use_packed_gqa
from ..models.fast_passes import use_fast_passes, use_int8_weights
from ..policies.measure import pass_medians
from .common import machine, markdown_table, write_results
from .efficiency import EfficiencyBenchmark, plot_speedups


def int8_torchao(draft: torch.nn.Module) -> torch.nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(draft, Int8WeightOnlyConfig())
    return draft


def int8_dynamic(draft: torch.nn.Module) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of torchao
        return torch.ao.quantization.quantize_dynamic(draft, {torch.nn.Linear}, dtype=torch.qint8)


def variants() -> dict:
    """name -> what it does to a fresh copy of the shipped draft, fast passes included (torchao's
    and torch's quantized layers replace nn.Linear, so they get packed GQA attention only)."""
    found = {"fp32": use_fast_passes, "int8 skinny": lambda draft: use_int8_weights(use_fast_passes(draft))}
    if importlib.util.find_spec("torchao") is not None:
        found["int8 torchao"] = lambda draft: use_packed_gqa(int8_torchao(draft))
    found["int8 dynamic"] = lambda draft: use_packed_gqa(int8_dynamic(draft))
    return found


def drafts(bench: EfficiencyBenchmark, kind: str) -> dict:
    """name -> the draft to pass to fast_generate with bench.target, one per :func:`variants`."""
    if kind == "feature":
        model = bench.target.model
        return {name: FeatureDraftLM(quantize(default_feature_draft(model)), bench.target)
                for name, quantize in variants().items()}
    return {name: quantize(default_draft(bench.target)) for name, quantize in variants().items()}


def run(num_prompts: int, k: int, temperatures: list[float], max_new_tokens: int, kind: str = "feature",
        out: Path = Path("results/quant")) -> dict:
    bench = EfficiencyBenchmark.default(num_prompts, kind, max_new_tokens=max_new_tokens, temperatures=tuple(temperatures))
    target = bench.target
    candidates = drafts(bench, kind)
    for draft in candidates.values():
        warmup(target, draft)
    ids = bench.prompt_ids(0)
    target_s, *draft_s = pass_medians([(target, 1)] + [(d, 1) for d in candidates.values()], ids)
    costs = {name: s / target_s for name, s in zip(candidates, draft_s)}

    methods = {"target alone": lambda p, s: dict(tps=generate_autoregressive(target, p, **s).stats.tokens_per_second)}
    for name, draft in candidates.items():
        def method(p, s, draft=draft):
            st = fast_generate(target, draft, p, num_draft_tokens=k, guard=False, **s).stats
            return dict(tps=st.tokens_per_second, acceptance=st.acceptance_rate)
        methods[f"{name} k={k}"] = method
    runs = bench.run(methods, "target alone", desc="prompts")
    summary = EfficiencyBenchmark.compare_with_baseline(runs, "target alone")
    data = dict(machine=machine(), settings=dict(draft=kind, prompts=len(bench.prompts), k=k, temperatures=temperatures,
                                                 max_new_tokens=max_new_tokens),
                target_step_s=target_s, c=costs, runs=runs, summary=summary)
    write_results(out, data, table(data))
    plot_speedups(summary, out, f"{kind} draft weights")
    return data


def table(data: dict) -> str:
    c = data["c"]
    rows = [[s["temperature"], s["method"], f"{s['tps']:.1f}", f"{s['speedup']:.3f}",
             f"{s['acceptance']:.3f}" if "acceptance" in s else "-"] for s in data["summary"]]
    costs = ", ".join(f"{name} {value:.3f}" for name, value in c.items())
    return (markdown_table(["T", "method", "tok/s", "speedup vs target", "acceptance"], rows) +
            f"\n\n{data['settings'].get('draft', 'token').capitalize()} draft. Medians over {data['settings']['prompts']} held-out prompts, {data['settings']['max_new_tokens']} tokens. "
            f"Draft step cost c (one-token pass / target's {data['target_step_s'] * 1e3:.1f} ms): {costs}.")
