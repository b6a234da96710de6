"""Feature drafts compared on the held-out prompts (``benchmarks/drafts.py``, ``specdec-fast draft-bench``).

What decides whether a newly trained draft ships: paired measures of two or more feature-draft
files on the same target and prompts. (1) Teacher-forced on the target's greedy answers, the
fraction of answer positions where each unrolled drafting step's top-1 token (over the draft's
token subset) is the target's top-1 (:meth:`FeatureDraft.unrolled_features`, tested equal to the
loop's steps). (2) ``fast_generate`` at a fixed draft length, the same seeds for every draft:
per-position acceptance pooled over prompts (accepted / drafted at each position) and tokens per
round. Counts are pooled rather than medians: the differences sought are a few per cent.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ..feature_draft import FeatureDraft, feature_pair, load_feature_draft
from ..generate import fast_generate
from ..smollm2 import use_fast_passes
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
def top1_agreement(target, draft: FeatureDraft, answers: list[tuple[int, torch.Tensor]], steps: int = 2) -> list[float]:
    """Per drafting step j = 1..steps, the fraction of answer positions t (prompt length <= t < L - 1)
    where the draft's step-j top-1 for token t + 1 equals the target's top-1 there, teacher-forced
    on ``answers`` (from :func:`greedy_answers`)."""
    vocab_ids = draft.lm.lm_head.vocab_ids
    hits, total = [0] * steps, 0
    for start, ids in answers:
        out = target(ids[None], output_hidden_states=True)
        h, want = out.hidden_states[-1], out.logits[0].argmax(-1)
        prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        positions = torch.arange(start, len(ids) - 1)
        total += len(positions)
        for j, features in enumerate(draft.unrolled_features(ids[None], prev, steps)):
            top1 = vocab_ids[draft.lm.lm_head.restricted(features[0, positions]).argmax(-1)]
            hits[j] += int((top1 == want[positions]).sum())
    return [h / max(total, 1) for h in hits]


def loop_acceptance(target, draft: FeatureDraft, prompts: list[list[int]], k: int, temperature: float,
                    max_new_tokens: int) -> dict:
    """``fast_generate`` with draft length k on each prompt (seed = prompt index, EOS off):
    per-position acceptance pooled over prompts and tokens per round."""
    accepted, drafted, tokens, rounds = [0] * k, [0] * k, 0, 0
    for seed, ids in enumerate(prompts):
        stats = fast_generate(*feature_pair(target, draft), ids, max_new_tokens=max_new_tokens, temperature=temperature,
                              num_draft_tokens=k, seed=seed, eos_token_id=()).stats
        for i, (a, d) in enumerate(zip(stats.accepted_at, stats.drafted_at)):
            accepted[i], drafted[i] = accepted[i] + a, drafted[i] + d
        tokens, rounds = tokens + stats.new_tokens, rounds + stats.rounds
    return dict(per_position=[a / d if d else 0.0 for a, d in zip(accepted, drafted)], accepted=accepted,
                drafted=drafted, tokens_per_round=tokens / rounds)


def run(paths: list[str], num_prompts: int | None, temperatures: list[float], k: int = 2, max_new_tokens: int = 128,
        out_name: str = "drafts") -> dict:
    bench = EfficiencyBenchmark.default(num_prompts, "feature", models=True)
    target = bench.target
    prompts = [bench.prompt_ids(i) for i in range(len(bench.prompts))]
    answers = greedy_answers(target, prompts, max_new_tokens)
    rows = []
    for path in tqdm(paths, desc="drafts"):
        draft = use_fast_passes(load_feature_draft(target, path).eval())
        row = dict(draft=path, top1=top1_agreement(target, draft, answers, steps=2))
        row["loop"] = {str(t): loop_acceptance(target, draft, prompts, k, t, max_new_tokens) for t in temperatures}
        rows.append(row)
    data = dict(machine=machine(), settings=dict(prompts=len(prompts), k=k, temperatures=temperatures,
                                                 max_new_tokens=max_new_tokens,
                                                 answer_positions=sum(len(ids) - 1 - start for start, ids in answers)),
                drafts=rows)
    write_results(out_name, data, table(data))
    return data


def table(data: dict) -> str:
    s = data["settings"]
    headers = ["draft", "top-1 step 1", "top-1 step 2"] + [f"T={t} {name}" for t in s["temperatures"]
                                                           for name in ("acceptance by position", "tokens/round")]
    rows = [[r["draft"], f"{r['top1'][0]:.3f}", f"{r['top1'][1]:.3f}"]
            + [cell for t in s["temperatures"] for cell in (" ".join(f"{a:.3f}" for a in r["loop"][str(t)]["per_position"]),
                                                           f"{r['loop'][str(t)]['tokens_per_round']:.3f}")] for r in data["drafts"]]
    return (markdown_table(headers, rows) + f"\n\n{s['prompts']} held-out prompts; top-1 teacher-forced on the target's "
            f"greedy answers ({s['answer_positions']} positions); the loop at k = {s['k']}, {s['max_new_tokens']} tokens, "
            "acceptance pooled over prompts (accepted / drafted at each position).")
