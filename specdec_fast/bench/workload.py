"""The workload benchmark (``specdec-fast bench --workload``): by prompt category (open chat,
grounded, multi-turn; held-out prompts of :mod:`specdec_fast.data.workload`) and temperature,
side by side in one run: llama.cpp on a GGUF of the same weights, plain and with its prompt
lookup (with the ``[peer]`` extra), transformers' ``generate``, its prompt lookup and its
assisted generation with our token draft, then our autoregressive loop (twice: an A/A
control), the feature draft with its shipped policy, prompt lookup and the hybrid (its default
choice by cost, and the fixed rule), all with the default guard, on the target's path at ``lean``
(the default reads the checkpoint's blocks: a compute-bound pass on a CPU; ``fp32-dense`` reads
whole fp32 matrices, as a user's dense checkpoint is read: a memory-bound pass). Each repeat
runs, prompt by prompt and temperature by temperature in a shuffled order, a block of every
engine back to back (in a shuffled order), after one untimed run of each engine; an engine's
ratio to our autoregressive loop is the median over blocks of the ratio within each block (the
VM's speed moves by up to 1.5x between minutes, not within a block); tokens/s and target passes
per token are medians over prompts, the prompt pass's share of the
wall time and the tokens/s after it (ours; transformers does not report them). Every engine makes
exactly ``max_new_tokens`` tokens (EOS does not stop it): at T = 1 the engines sample different
texts, and one that ended early would be timed mostly on its prompt pass.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch

from ..data.workload import CATEGORIES, workload_prompts
from ..decoding import batch_generate, fast_generate, generate_autoregressive
from ..decoding.requests import chat_ids
from ..drafts.hybrid import Hybrid
from ..drafts.lookup import PromptLookup
from ..drafts.shipped import default_draft, default_feature_draft
from ..models.fast_passes import use_fast_passes
from ..models.smollm2 import gguf_path, load_smollm2, smollm2_path
from ..policies.baselines import FixedDraftLength
from ..policies.shipped import default_policy
from .common import machine, markdown_table, pyplot, save_figure, write_results
from .peer import LlamaCppPeer, gguf_file, peer_missing

LOOKUP_TOKENS = 8
CONTEXT = 4096  # llama.cpp's context: the longest workload prompt and its answer
OURS = ("autoregressive", "autoregressive (A/A)", "feature draft", "prompt lookup", "hybrid", "hybrid (rule)")
HYBRIDS = ("hybrid", "hybrid (rule)")


def peer_file(lean: str) -> str:
    """The GGUF llama.cpp runs beside ours at ``lean``: the same numbers ("F32", a conversion of the
    checkpoint), or with 8-bit activations the shipped Q4_1 file itself (llama.cpp's own integer arithmetic)."""
    return "Q4_1" if lean == "q8" else "F32"


def _engines(max_new_tokens: int, lean: str, peers: bool = True) -> dict:
    """(name -> run(ids, temperature) -> (new tokens, target passes or None, seconds of the prompt pass
    or None), the tokenizer), on SmolLM2-135M-Instruct, ours on the target's path at ``lean``;
    without ``peers``, ours only (no transformers or llama.cpp engine)."""
    plain, _ = load_smollm2()  # transformers' own modules, for transformers' engines
    target, tokenizer = load_smollm2()
    use_fast_passes(target)
    token, feature = default_draft(plain), default_feature_draft(target)
    def hf(**extra):
        def run(ids, temperature):
            x = torch.tensor([ids])
            sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
            out = plain.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, **sampling, **extra)
            return out.shape[1] - len(ids), None, None
        return run

    def ours(draft, policy=None):
        """Our engine with ``draft`` (None: autoregressive; a callable: a fresh draft per run)."""
        def run(ids, temperature):
            settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=0, eos_token_id=(), lean=lean)
            fresh = draft() if callable(draft) and not isinstance(draft, torch.nn.Module) else draft
            out = (generate_autoregressive(target, ids, **settings) if draft is None
                   else fast_generate(target, fresh, ids, policy=policy() if policy else None, **settings))
            return len(out.tokens), out.stats.target_calls, out.stats.prefill_s
        return run

    def llama_cpp(peer):
        def run(ids, temperature):
            return len(peer.generate(ids, max_new_tokens, temperature)), None, None
        return run

    others = {}
    if peers and peer_missing() is None:  # the [peer] extra: llama.cpp on a GGUF of the same numbers
        kind, threads = peer_file(lean), torch.get_num_threads()
        gguf = gguf_path() if kind == "Q4_1" else gguf_file(smollm2_path(), kind)
        others = {f"llama.cpp ({kind})": llama_cpp(LlamaCppPeer(gguf, threads, CONTEXT)),
                  f"llama.cpp prompt lookup ({kind})": llama_cpp(LlamaCppPeer(gguf, threads, CONTEXT, lookup_tokens=10))}
    if peers:
        others |= {"transformers generate": hf(), "transformers prompt lookup": hf(prompt_lookup_num_tokens=10),
                   "transformers assisted (token draft)": hf(assistant_model=token)}
    return others | {
        "autoregressive": ours(None),
        "autoregressive (A/A)": ours(None),
        "feature draft": ours(feature, lambda: default_policy(draft=feature)),
        "prompt lookup": ours(PromptLookup(max_tokens=LOOKUP_TOKENS), lambda: FixedDraftLength(LOOKUP_TOKENS)),
        "hybrid": ours(Hybrid(feature, PromptLookup(max_tokens=LOOKUP_TOKENS)), lambda: default_policy(draft=feature)),
        "hybrid (rule)": ours(Hybrid(feature, PromptLookup(max_tokens=LOOKUP_TOKENS), rule=True),
                              lambda: default_policy(draft=feature)),
    }, tokenizer


def _batched_engines(max_new_tokens: int, lean: str) -> dict:
    """(name -> run(list of B prompts' ids, temperature) -> (new tokens, target passes, seconds of the
    prompt passes), the tokenizer): batch_generate with each of our drafts, and without one, at ``lean``."""
    target, tokenizer = load_smollm2()
    use_fast_passes(target)
    feature = default_feature_draft(target)

    def ours(draft, policy):
        def run(group, temperature):
            out = batch_generate(target, draft, input_ids=group, max_new_tokens=max_new_tokens, temperature=temperature,
                                 seeds=list(range(len(group))), policy=policy(), eos_token_id=(), lean=lean)
            return (sum(len(o.tokens) for o in out.outputs), sum(o.stats.target_calls for o in out.outputs),
                    out.outputs[0].stats.prefill_s)
        return run

    fixed = lambda: FixedDraftLength(LOOKUP_TOKENS)  # noqa: E731
    return {
        "autoregressive": ours(None, fixed),
        "autoregressive (A/A)": ours(None, fixed),
        "feature draft": ours(feature, lambda: default_policy(draft=feature)),
        "prompt lookup": ours(PromptLookup(max_tokens=LOOKUP_TOKENS), fixed),
        "hybrid": ours(Hybrid(feature, PromptLookup(max_tokens=LOOKUP_TOKENS)), lambda: default_policy(draft=feature)),
    }, tokenizer


def run(categories: list[str], prompts: int, temperatures: list[float], max_new_tokens: int, repeats: int,
        out: Path = Path("results/workload"), batch: int = 1, lean: str = "auto", peers: bool = True) -> dict:
    """Every engine on every prompt (``batch`` > 1: our engines in batch_generate on groups of
    ``batch`` prompts) at each temperature, ours at ``lean`` (without ``peers``: ours only); writes
    ``out``.{json,md,png}."""
    if not 1 <= batch <= prompts:
        raise ValueError(f"batch must be in 1..prompts ({prompts}), got {batch}")
    engines, tokenizer = _engines(max_new_tokens, lean, peers) if batch == 1 else _batched_engines(max_new_tokens, lean)
    prompt_ids = {c: [chat_ids(tokenizer, chat) for chat in workload_prompts(c)[:prompts]] for c in categories}
    chats = {c: [ids[i: i + batch] for i in range(0, len(ids) - batch + 1, batch)] for c, ids in prompt_ids.items()}
    blocks = [(c, i, t) for c in categories for i in range(len(chats[c])) for t in temperatures]
    samples = {(c, i, t, e): [] for c, i, t in blocks for e in engines}
    first = chats[categories[0]][0]
    for e in engines:  # warm-up, not timed: kernels built and loaded, weights packed, caches made, costs calibrated
        engines[e](first if batch > 1 else first[0], temperatures[0])
    order = random.Random(0)
    for _ in range(repeats):
        order.shuffle(blocks)
        for c, i, t in blocks:  # a block: every engine on one prompt and temperature, back to back, in a shuffled order
            names = list(engines)
            order.shuffle(names)
            for e in names:
                start = time.perf_counter()
                tokens, passes, prompt_s = engines[e](chats[c][i] if batch > 1 else chats[c][i][0], t)
                seconds = time.perf_counter() - start
                samples[c, i, t, e].append((tokens / seconds, passes / tokens if passes else None,
                                            None if prompt_s is None else (prompt_s / seconds, tokens / (seconds - prompt_s))))
    rows = []
    for c in categories:
        for t in temperatures:
            for e in engines:
                cell = [samples[c, i, t, e] for i in range(len(chats[c]))]
                base = [samples[c, i, t, "autoregressive"] for i in range(len(chats[c]))]
                passes = [statistics.median(s[1] for s in runs) for runs in cell if runs[0][1] is not None]
                prompt = ([[statistics.median(s[2][j] for s in runs) for runs in cell] for j in (0, 1)]
                          if cell[0][0][2] is not None else None)
                # x our autoregressive: the median over blocks of the ratio within each block (runs minutes apart
                # meet the machine at other speeds; runs of one block meet it at one)
                paired = [run[0] / ref[0] for runs, refs in zip(cell, base) for run, ref in zip(runs, refs)]
                after = ([run[2][1] / ref[2][1] for runs, refs in zip(cell, base) for run, ref in zip(runs, refs)]
                         if prompt else None)
                rows.append(dict(category=c, temperature=t, engine=e,
                                 tokens_per_s=statistics.median(statistics.median(s[0] for s in runs) for runs in cell),
                                 passes_per_token=statistics.median(passes) if passes else None,
                                 prompt_share=statistics.median(prompt[0]) if prompt else None,
                                 after_prompt_tokens_per_s=statistics.median(prompt[1]) if prompt else None,
                                 vs_autoregressive=statistics.median(paired), vs_autoregressive_all=paired,
                                 after_prompt_vs_autoregressive=statistics.median(after) if after else None))
    data = dict(machine=machine(), settings=dict(categories=categories, prompts=prompts, temperatures=temperatures,
                                                 max_new_tokens=max_new_tokens, repeats=repeats, batch=batch, lean=lean,
                                                 prompt_counts={c: len(chats[c]) * batch for c in categories}), rows=rows)
    write_results(out, data, table(data))
    plot(data, out.with_suffix(".png"))
    return data


def summary(data: dict) -> list[list]:
    """Per (category, T): the hybrids against our autoregressive loop (and after the prompt pass), the best single source
    (feature draft or lookup), transformers' and llama.cpp's prompt lookup; the A/A control. Every ratio is of two
    engines' paired ratios to our autoregressive loop (the median of the per-block ratios)."""
    rows = []
    paired = {(r["category"], r["temperature"], r["engine"]): r["vs_autoregressive"] for r in data["rows"]}
    after = {(r["category"], r["temperature"], r["engine"]): r.get("after_prompt_vs_autoregressive") for r in data["rows"]}
    for c, t in dict.fromkeys((r["category"], r["temperature"]) for r in data["rows"]):
        best = max(paired[c, t, "feature draft"], paired[c, t, "prompt lookup"])
        lookups = ("transformers prompt lookup", f"llama.cpp prompt lookup ({peer_file(data['settings'].get('lean', 'auto'))})")
        peers = [paired.get((c, t, name)) for name in lookups]
        for hybrid in HYBRIDS:
            if (c, t, hybrid) in paired:
                h = paired[c, t, hybrid]
                rows.append([c, t, hybrid, h, after[c, t, hybrid] or "-", h / best, *(h / p if p else "-" for p in peers),
                             paired[c, t, "autoregressive (A/A)"]])
    return rows


def table(data: dict) -> str:
    s = data["settings"]
    batched = f"our engines in batch_generate, {s['batch']} prompts per batch; " if s.get("batch", 1) > 1 else ""
    path = {"auto": "fp32 from the checkpoint's blocks", "fp32": "fp32 from the checkpoint's blocks",
            "fp32-dense": "fp32 read as whole matrices",
            "q8": "the checkpoint's blocks against 8-bit activations (integer products)"}.get(s.get("lean", "auto"), s.get("lean"))
    head = (f"Held-out prompts per category: {s['prompt_counts']}; {batched}{s['max_new_tokens']} new tokens; medians over "
            f"prompts of {s['repeats']} repeat(s), every engine making all the tokens (EOS ignored). Our engines run the target "
            f"on the lean path, {path}, with the default guard.\n\n")
    return head + markdown_table(
        ["category", "T", "engine", "tokens/s", "x our autoregressive", "target passes / token", "prompt pass share",
         "x our autoregressive after the prompt pass"],
        [[r["category"], r["temperature"], r["engine"], r["tokens_per_s"], r["vs_autoregressive"],
          *(r[key] if r.get(key) is not None else "-" for key in ("passes_per_token", "prompt_share",
                                                                 "after_prompt_vs_autoregressive"))]
         for r in data["rows"]]) + "\n\n" + markdown_table(
        ["category", "T", "hybrid", "x our autoregressive", "after the prompt pass", "x best single source",
         "x transformers prompt lookup",
         "x llama.cpp prompt lookup", "A/A"], summary(data))


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    groups = sorted({(r["category"], r["temperature"]) for r in data["rows"]}, key=lambda g: (CATEGORIES.index(g[0]), g[1]))
    engines = list(dict.fromkeys(r["engine"] for r in data["rows"]))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(engines)
    for j, e in enumerate(engines):
        values = [next(r["vs_autoregressive"] for r in data["rows"] if (r["category"], r["temperature"], r["engine"]) == (*g, e))
                  for g in groups]
        ax.bar([i + j * width for i in range(len(groups))], values, width, label=e)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], [f"{c}\nT = {t:g}" for c, t in groups])
    ax.set_ylabel("tokens/s / our autoregressive loop")
    ax.set_title("Workload benchmark, SmolLM2-135M-Instruct, held-out prompts")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)
