"""Feature drafts compared on the held-out prompts (``benchmarks/drafts.py``, ``specdec-fast draft-bench``).

What decides whether a newly trained draft ships: paired measures of two or more feature-draft
files on the same target and prompts. (0) The draft's cost c (one-token pass over the target's).
(1) Teacher-forced on the target's greedy answers, the fraction of answer positions where the
target's top-1 is each unrolled drafting step's top-1 token (over the draft's token subset), or
among its top 3 (:meth:`FeatureDraft.unrolled_features`, tested equal to the
loop's steps). (2) ``fast_generate`` at a fixed draft length, the same seeds for every draft:
per-position acceptance pooled over prompts (accepted / drafted at each position) and tokens per
round. Counts are pooled rather than medians: the differences sought are a few per cent.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from ..decoding import fast_generate
from ..drafts.feature import FeatureDraft, load_feature_draft
from ..drafts.feature_lm import feature_pair
from ..models.fast_passes import use_fast_passes
from ..policies.measure import step_costs
from .common import machine, markdown_table, write_results
from .efficiency import EfficiencyBenchmark


@torch.inference_mode()
def greedy_answers(target, prompts: list[list[int]], max_new_tokens: int) -> list[tuple[int, torch.Tensor]]:
    """(prompt length, prompt + the target's greedy answer as ids [L] int64) per prompt (EOS ends an answer)."""
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        row = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                              top_k=None, top_p=None, temperature=None, pad_token_id=target.config.eos_token_id)
        out.append((len(ids), row[0]))
    return out


@torch.inference_mode()
def agreement(target, draft: FeatureDraft, answers: list[tuple[int, torch.Tensor]], steps: int = 2,
              tops: tuple[int, ...] = (1, 3)) -> dict[int, list[float]]:
    """{n: per drafting step j = 1..steps, the fraction of answer positions t (prompt length <= t < L - 1)
    where the target's top-1 token for t + 1 is among the draft's step-j top-n (over its token subset)},
    teacher-forced on ``answers`` (from :func:`greedy_answers`). Top-1 is what a chain of drafts
    can accept at T = 0; top-n bounds what n candidates per position (a tree) could."""
    vocab_ids = draft.lm.lm_head.vocab_ids
    hits, total = {n: [0] * steps for n in tops}, 0
    for start, ids in answers:
        out = target(ids[None], output_hidden_states=True)
        h, want = out.hidden_states[-1], out.logits[0].argmax(-1)
        prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        positions = torch.arange(start, len(ids) - 1)
        total += len(positions)
        for j, features in enumerate(draft.unrolled_features(ids[None], prev, steps)):
            logits = draft.lm.lm_head.restricted(features[0, positions])
            for n in tops:
                top = vocab_ids[logits.topk(min(n, logits.shape[-1]), -1).indices]
                hits[n][j] += int((top == want[positions, None]).any(-1).sum())
    return {n: [h / max(total, 1) for h in per_step] for n, per_step in hits.items()}


def loop_acceptance(target, draft: FeatureDraft, prompts: list[list[int]], k: int, temperature: float,
                    max_new_tokens: int) -> dict:
    """``fast_generate`` with draft length k on each prompt (seed = prompt index, EOS off):
    per-position acceptance pooled over prompts and tokens per round."""
    accepted, drafted, tokens, rounds = [0] * k, [0] * k, 0, 0
    for seed, ids in enumerate(prompts):
        stats = fast_generate(*feature_pair(target, draft), ids, max_new_tokens=max_new_tokens, temperature=temperature,
                              num_draft_tokens=k, seed=seed, eos_token_id=(), guard=False).stats
        for i, (a, d) in enumerate(zip(stats.accepted_at, stats.drafted_at)):
            accepted[i], drafted[i] = accepted[i] + a, drafted[i] + d
        tokens, rounds = tokens + stats.new_tokens, rounds + stats.rounds
    return dict(per_position=[a / d if d else 0.0 for a, d in zip(accepted, drafted)], accepted=accepted,
                drafted=drafted, tokens_per_round=tokens / rounds)


def run(paths: list[str], num_prompts: int | None, temperatures: list[float], k: int = 2, max_new_tokens: int = 128,
        out: Path = Path("results/drafts")) -> dict:
    bench = EfficiencyBenchmark.default(num_prompts, "feature", models=True)
    target = bench.target
    prompts = [bench.prompt_ids(i) for i in range(len(bench.prompts))]
    answers = greedy_answers(target, prompts, max_new_tokens)
    longest = max(answers, key=lambda a: len(a[1]))[1].tolist()  # the caches c is timed with
    rows = []
    for path in tqdm(paths, desc="drafts"):
        draft = use_fast_passes(load_feature_draft(target, path).eval())
        row = dict(draft=path, layers=len(draft.lm.model.layers), c=step_costs(*feature_pair(target, draft), longest, 1)["c"])
        row["agreement"] = {str(n): v for n, v in agreement(target, draft, answers, steps=2).items()}
        row["loop"] = {str(t): loop_acceptance(target, draft, prompts, k, t, max_new_tokens) for t in temperatures}
        rows.append(row)
    data = dict(machine=machine(), settings=dict(prompts=len(prompts), k=k, temperatures=temperatures,
                                                 max_new_tokens=max_new_tokens,
                                                 answer_positions=sum(len(ids) - 1 - start for start, ids in answers)),
                drafts=rows)
    write_results(out, data, table(data))
    return data


def table(data: dict) -> str:
    s = data["settings"]
    headers = ["draft", "layers", "c", "top-1 step 1 / 2", "top-3 step 1 / 2"] + [
        f"T={t} {name}" for t in s["temperatures"] for name in ("acceptance by position", "tokens/round")]
    rows = [[r["draft"], r["layers"], f"{r['c']:.3f}"] + [" / ".join(f"{a:.3f}" for a in r["agreement"][n]) for n in ("1", "3")]
            + [cell for t in s["temperatures"] for cell in (" ".join(f"{a:.3f}" for a in r["loop"][str(t)]["per_position"]),
                                                           f"{r['loop'][str(t)]['tokens_per_round']:.3f}")] for r in data["drafts"]]
    return (markdown_table(headers, rows) + f"\n\n{s['prompts']} held-out prompts; c = the draft's one-token pass over the "
            "target's (median of 15, caches holding the longest answer); top-n = the target's top-1 among the draft's top n, "
            f"teacher-forced on the target's greedy answers ({s['answer_positions']} positions); the loop at k = {s['k']}, {s['max_new_tokens']} tokens, "
            "acceptance pooled over prompts (accepted / drafted at each position).")
