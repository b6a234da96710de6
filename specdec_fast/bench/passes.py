"""The target's own pass (``specdec-fast pass-bench``): one-token and (k+1)-token pass times of
SmolLM2-135M-Instruct through transformers (eager), our previous path (skinny linear + packed
GQA on transformers' modules), the lean path (fp32 read from the checkpoint's Q4_1 / Q8_0 blocks,
an A/A twin, the same fp32 matrices read whole, bf16, int8) and llama.cpp on GGUFs of the same
checkpoint (F32, BF16, and the shipped Q4_1 file itself; skipped, saying why, without
llama-cpp-python), beside
the bound that the read bandwidth measured in the same run sets (the larger of two plain reads); then greedy decoding of chat
prompts by each engine, and by fast_generate with the shipped feature draft and its shipped policy
(the main job); and the feature draft's own step, by transformers and on the lean path.

Every repeat runs every cell once, in a shuffled order, so the machine's drift falls on all
alike; medians are reported.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from pathlib import Path

import torch

from ..data.prompts import heldout_prompts
from ..decoding import fast_generate, generate_autoregressive
from ..decoding.calibrate import machine_rates
from ..decoding.requests import chat_prompt_ids
from ..drafts.feature_lm import feature_pair
from ..drafts.shipped import default_feature_draft
from ..kernels.linear import skinny_linear
from ..models.cached_lm import HFCachedLM
from ..models.fast_passes import use_fast_passes
from ..models.lean import PRECISIONS, LeanLM, LeanWeights
from ..models.smollm2 import gguf_path, load_smollm2, smollm2_path
from ..policies.shipped import default_policy
from .common import machine, markdown_table, median_time, pyplot, save_figure, write_results
from .microbench import read_bandwidth
from .peer import LlamaCppPeer, gguf_fails, gguf_file, peer_build, peer_missing

SIZES = (1, 2, 3, 4, 5, 9)  # tokens in a pass: k + 1 for k = 0..4 and 8
AGREEMENT = (("autoregressive, lean fp32", "llama.cpp F32"), ("autoregressive, lean q8", "llama.cpp Q4_1"))  # same numbers, same arithmetic
CACHED = (64, 512)


def _engines(model, eager, threads: int) -> tuple[dict, dict, str | None]:
    """(our caches by name, llama.cpp peers by name, why the peers are missing or None); ``eager``: a
    copy of ``model`` that keeps transformers' own modules."""
    ours = {"transformers eager": lambda: HFCachedLM(eager), "skinny + packed GQA": lambda: HFCachedLM(use_fast_passes(model)),
            "lean fp32": lambda: LeanLM(model), "lean fp32 (A/A)": lambda: LeanLM(model),
            "lean fp32-dense": lambda: LeanLM(model, "fp32-dense"),
            "lean bf16": lambda: LeanLM(model, "bf16"), "lean int8": lambda: LeanLM(model, "int8"),
            "lean q8": lambda: LeanLM(model, "q8")}
    missing = peer_missing()
    peers = {} if missing else {f"llama.cpp {t}": LlamaCppPeer(gguf_file(smollm2_path(), t), threads) for t in ("F32", "BF16")}
    if not missing:
        broken = gguf_fails(gguf_path(), threads)
        if broken:
            missing = f"Q4_1 only: {broken}"
        else:
            peers["llama.cpp Q4_1"] = LlamaCppPeer(gguf_path(), threads)
    return ours, peers, missing


def filler_ids(n: int) -> list[int]:
    """``n`` token ids spread over SmolLM2's vocabulary: the text of the timed passes."""
    return [(i * 7) % 49152 + 1 for i in range(n)]


def pass_times(ours: dict, peers: dict, repeats: int) -> dict[tuple[str, int, int], float]:
    """Median seconds per (engine, cached tokens, tokens in the pass)."""
    ids = filler_ids(max(CACHED))
    held = {}
    for c in CACHED:
        for name, make in ours.items():
            lm = make()
            lm.extend(torch.tensor(ids[:c]), 1)
            held[name, c] = lm
    cells = [(name, c, n) for name in list(ours) + list(peers) for c in CACHED for n in SIZES]
    samples = {cell: [] for cell in cells}
    order = random.Random(0)
    for _ in range(repeats + 1):  # the first round warms every cell up and is dropped
        order.shuffle(cells)
        for name, c, n in cells:
            tokens = ids[c: c + n] if c + n <= len(ids) else ids[:n]
            if name in peers:
                if peers[name].llm.n_tokens != c:
                    peers[name].hold(ids[:c])
                seconds = peers[name].timed_pass(tokens)
            else:
                lm = held[name, c]
                start = time.perf_counter()
                lm.extend(torch.tensor(tokens), n)
                seconds = time.perf_counter() - start
                lm.crop(c)
            samples[name, c, n].append(seconds)
    return {cell: statistics.median(x[1:]) for cell, x in samples.items()}


def draft_steps(model, repeats: int) -> list[dict]:
    """Median ms of one step of the shipped feature draft (one token whose previous feature is the
    target's) after each of CACHED tokens, its layers run by transformers and on the lean path."""
    ids, feature, rows = filler_ids(max(CACHED) + 1), default_feature_draft(model), []
    for name, lean in (("transformers", "off"), ("lean path (int8)", "auto")):
        target, draft = feature_pair(model, feature, lean)
        for c in CACHED:
            target.reset()
            draft.reset()
            target.extend(torch.tensor(ids[: c + 1]), 1)
            draft.extend(torch.tensor(ids[:c]), 1)

            def step(c=c):
                draft.extend(torch.tensor(ids[c: c + 1]), 1)
                draft.crop(c)
            rows.append(dict(draft=f"feature draft, {name}", cached=c, ms=median_time(step, repeats) * 1e3))
    return rows


def read_bandwidth_best(repeats: int = 7) -> dict[str, float]:
    """Bytes per second of two plain reads of memory, measured now: a sum over 1 GiB (torch) and a
    one-row product with a 512 MiB fp32 matrix (the skinny kernel alone); the larger is the bound."""
    weight, x = torch.randn(1 << 15, 1 << 12), torch.randn(1, 1 << 12)
    gemv = weight.numel() * 4 / median_time(lambda: skinny_linear(x, weight), repeats)
    return dict(sum=read_bandwidth("cpu"), gemv=gemv)


def weight_bytes(model) -> dict[str, int]:
    """Bytes a one-token pass must read per lean precision (the matrices; one embedding row): "fp32"
    and "q8" from the checkpoint's blocks, "fp32-dense" whole fp32 matrices, "bf16", "int8"."""
    out = {}
    for precision in PRECISIONS:
        w = LeanWeights.of(model, precision)
        out[precision] = sum(t.numel() * t.element_size() for t in w.weights + w.scales) + w.embed.shape[1] * 4
    return out


def weight_key(engine: str) -> str:
    """The :func:`weight_bytes` key of an engine's weights: transformers and llama.cpp F32 read fp32
    matrices whole, llama.cpp Q4_1 blocks (a little fewer bytes than ours: fp16 scales)."""
    for precision in ("fp32-dense", "bf16", "int8", "q8"):
        if precision in engine.lower():
            return precision
    return "fp32-dense" if engine in ("transformers eager", "skinny + packed GQA", "llama.cpp F32") else "fp32"


def kv_bytes(model, cached: int) -> int:
    c = model.config
    return cached * c.num_hidden_layers * 2 * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4


def decode(model, eager, tokenizer, peers: dict, prompts: int, max_new_tokens: int, repeats: int) -> dict:
    """Greedy tokens/s (wall time, prompt pass included) per engine on ``prompts`` chat prompts, and
    how many of llama.cpp's greedy tokens ours match before the first difference (:data:`AGREEMENT`)."""
    chats = [chat_prompt_ids(tokenizer, p["prompt"]) for p in heldout_prompts()[:prompts]]
    feature = default_feature_draft(model)
    runs = {
        "transformers generate": lambda ids: eager.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                                            do_sample=False, max_new_tokens=max_new_tokens,
                                                            min_new_tokens=max_new_tokens)[0, len(ids):].tolist(),
        "autoregressive, skinny + packed GQA": lambda ids: generate_autoregressive(
            model, ids, max_new_tokens=max_new_tokens, eos_token_id=(), lean="off").tokens,
        "autoregressive, lean fp32": lambda ids: generate_autoregressive(model, ids, max_new_tokens=max_new_tokens, eos_token_id=()).tokens,
        "autoregressive, lean fp32-dense": lambda ids: generate_autoregressive(model, ids, max_new_tokens=max_new_tokens,
                                                                               eos_token_id=(), lean="fp32-dense").tokens,
        "autoregressive, lean bf16": lambda ids: generate_autoregressive(model, ids, max_new_tokens=max_new_tokens, eos_token_id=(),
                                                                         lean="bf16").tokens,
        "autoregressive, lean q8": lambda ids: generate_autoregressive(model, ids, max_new_tokens=max_new_tokens, eos_token_id=(),
                                                                       lean="q8").tokens,
        "fast_generate feature draft, lean fp32": lambda ids: fast_generate(
            model, feature, ids, max_new_tokens=max_new_tokens, eos_token_id=(), policy=default_policy(draft=feature)).tokens,
        "fast_generate feature draft, lean off": lambda ids: fast_generate(
            model, feature, ids, max_new_tokens=max_new_tokens, eos_token_id=(), policy=default_policy(draft=feature),
            lean="off").tokens,
        **{name: (lambda ids, p=p: p.greedy(ids, max_new_tokens)[0]) for name, p in peers.items()},
    }
    use_fast_passes(model)
    cells = [(name, i) for name in runs for i in range(len(chats))]
    seconds, tokens = {cell: [] for cell in cells}, {}
    order = random.Random(1)
    for _ in range(repeats):
        order.shuffle(cells)
        for name, i in cells:
            start = time.perf_counter()
            tokens[name, i] = runs[name](chats[i])
            seconds[name, i].append(time.perf_counter() - start)
    rates = {name: statistics.median(max_new_tokens / statistics.median(seconds[name, i]) for i in range(len(chats)))
             for name in runs}
    match = {f"{ours} / {theirs}": [next((j for j, (a, b) in enumerate(zip(tokens[theirs, i], tokens[ours, i])) if a != b),
                                         max_new_tokens) for i in range(len(chats))]
             for ours, theirs in AGREEMENT if theirs in runs}
    return dict(tokens_per_s=rates, same_greedy_prefix=match)


def run(repeats: int, prompts: int, max_new_tokens: int, decode_repeats: int, out: Path = Path("results/passes")) -> dict:
    model, tokenizer = load_smollm2()
    threads = torch.get_num_threads()
    reads = read_bandwidth_best()
    bandwidth = max(reads.values())
    eager = copy.deepcopy(model)  # before any fast-pass swap: transformers' own modules
    ours, peers, missing = _engines(model, eager, threads)
    if missing:
        print(f"llama.cpp peer skipped: {missing}")
    times = pass_times(ours, peers, repeats)
    weights, gflops = weight_bytes(model), machine_rates(threads)[0]
    flops = 2 * LeanWeights.of(model, "fp32").sizes()[0]  # per token of a pass
    rows = []
    for name in list(ours) + list(peers):
        for c in CACHED:
            bound_s = max((weights[weight_key(name)] + kv_bytes(model, c)) / bandwidth, flops / (gflops * 1e9))
            t1, wide = times[name, c, 1], times[name, c, SIZES[-1]]
            rows.append(dict(engine=name, cached=c, **{f"ms_{n}": times[name, c, n] * 1e3 for n in SIZES},
                             tokens_per_s=1 / t1, v=[times[name, c, n] / t1 for n in SIZES], of_bound=bound_s / t1,
                             bound_tokens_per_s=1 / bound_s, wide_of_matmul=flops * SIZES[-1] / wide / (gflops * 1e9)))
    data = dict(machine=machine(), settings=dict(repeats=repeats, threads=threads, prompts=prompts,
                                                 max_new_tokens=max_new_tokens, decode_repeats=decode_repeats),
                read_bandwidth_gbps=bandwidth / 1e9, reads_gbps={k: v / 1e9 for k, v in reads.items()}, matmul_gflops=gflops,
                weight_bytes=weights, peer_missing=missing, peer_build=peer_build(), passes=rows,
                draft_steps=draft_steps(model, 5 * repeats), decode=decode(model, eager, tokenizer, peers, prompts, max_new_tokens, decode_repeats))
    write_results(out, data, table(data))
    plot(data, out.with_suffix(".png"))
    return data


def table(data: dict) -> str:
    passes = markdown_table(
        ["engine", "cached", *[f"{n}-token ms" for n in SIZES], "tokens/s (1-token)", "v(8) = 9-token / 1-token",
         "1-token pass of its bound", f"{SIZES[-1]}-token pass of the matrix product's rate"],
        [[r["engine"], r["cached"], *[r[f"ms_{n}"] for n in SIZES], r["tokens_per_s"], r["v"][-1], r["of_bound"],
          r.get("wide_of_matmul", "-")] for r in data["passes"]])
    one = {r["cached"]: r["ms_1"] for r in data["passes"] if r["engine"] == "lean fp32"}
    steps = markdown_table(["draft", "cached", "step ms", "c = step / lean fp32 1-token pass"],
                           [[r["draft"], r["cached"], r["ms"], r["ms"] / one[r["cached"]]] for r in data["draft_steps"]])
    d = data["decode"]
    decoded = markdown_table(["engine", "greedy tokens/s (median of prompts)"], [[k, v] for k, v in d["tokens_per_s"].items()])
    reads = data["reads_gbps"]
    note = (f"Read bandwidth {data['read_bandwidth_gbps']:.1f} GB/s, the larger of a sum over 1 GiB ({reads['sum']:.1f}) "
            f"and a one-row product with a 512 MiB matrix ({reads['gemv']:.1f}); a 1024^3 fp32 matrix product "
            f"{data.get('matmul_gflops', 0):.0f} GFLOP/s on the same threads. A one-token pass's bound: the larger of (weights + "
            "KV cache read) / bandwidth and 2 FLOPs per weight at the matrix product's rate; the 9-token pass's rate counts 2 "
            "FLOPs per weight per token. " + (f"llama.cpp peer skipped: {data['peer_missing']}." if data["peer_missing"] else "")
            + (f"llama.cpp built for: {data['peer_build']}." if data.get("peer_build") else ""))
    match = "".join(f"\n\nGreedy tokens of {pair} equal before the first difference, per prompt: {prefix}"
                    for pair, prefix in d.get("same_greedy_prefix", {}).items())
    rates = d["tokens_per_s"]
    if "llama.cpp Q4_1" in rates:
        match += "".join(f"\n\nOur autoregressive loop on the Q4_1 file's numbers ({name}) / llama.cpp on the file itself: "
                         f"{rates[f'autoregressive, {name}'] / rates['llama.cpp Q4_1']:.2f}x" for name in ("lean fp32", "lean q8"))
    return f"{note}\n\n{passes}\n\nThe shipped feature draft's step:\n\n{steps}\n\nGreedy decoding, {data['settings']['max_new_tokens']} new tokens, chat prompts:\n\n{decoded}{match}"


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    rows = [r for r in data["passes"] if r["cached"] == CACHED[0]]
    for r in rows:
        ax.plot(SIZES, [r[f"ms_{n}"] for n in SIZES], marker="o", label=r["engine"])
    ax.set_xlabel("tokens in the pass (k + 1)")
    ax.set_ylabel("ms per pass")
    ax.set_title(f"SmolLM2-135M-Instruct pass after {CACHED[0]} cached tokens ({data['settings']['threads']} threads)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    save_figure(fig, path)
