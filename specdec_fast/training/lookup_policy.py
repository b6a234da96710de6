"""``specdec-fast train-policy --draft lookup``: the source chooser's lookup acceptance model.

1. Traces: fast_generate with a prompt lookup that drafts everything it finds (up to
   ``max_tokens``) on the tuning prompts of every workload category (never the held-out ones)
   at each temperature. For each proposed token: its LOOKUP_FEATURES (the match length and how
   much the match offers, its position, the temperature, the sequence's lookup acceptance so
   far) and, as the soft label, the target's warped probability p_i(X_i) of the token: the
   exact probability that a point mass is accepted once the tokens before it are.
2. :class:`~specdec_fast.policies.sources.LookupAcceptance` fitted to the labels (binary
   cross-entropy), calibrated on every fifth prompt, not fitted on.
3. Round times over 1..max_tokens + 1 tokens (the costs' priors): the target pass measured, plus
   the median seconds a traced round spent outside its pass. One safetensors file.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.workload import CATEGORIES, workload_prompts
from ..decoding.requests import chat_ids
from ..decoding.speculative import fast_generate
from ..drafts.lookup import PromptLookup
from ..kernels import warp_logits
from ..kernels.lookup import LookupIndex
from ..models.fast_passes import use_fast_passes
from ..models.smollm2 import load_smollm2
from ..policies.baselines import FixedDraftLength
from ..policies.measure import affine_fit, pass_medians
from ..policies.sources import PRIOR_ACCEPTANCE, LookupAcceptance, lookup_features, save_lookup_acceptance

LOOKUP_STEP_S = 1e-5  # a lookup's proposal (the cost model's "draft step"; measured ~5-10 us)


class LookupRecorder:
    """``on_round`` of one generation: replays the lookup on the committed tokens (a mirror of the
    draft's index, checked against what it drafted) and records each proposed token's features
    and label."""

    def __init__(self, prompt: list[int], temperature: float, max_tokens: int, smoothing: float = 0.8):
        self.ids, self.temperature, self.max_tokens, self.smoothing = list(prompt), temperature, max_tokens, smoothing
        self.recent = PRIOR_ACCEPTANCE
        self.features, self.labels = [], []

    def __call__(self, target_logits, draft_probs, draft_tokens, out) -> None:
        k = len(draft_tokens)
        if k:
            index = LookupIndex(1, max_n=PromptLookup().max_n)
            index.append(0, self.ids)
            index.commit()
            plan, offered, matched = index.propose(self.max_tokens, PromptLookup().min_n)
            if plan[0, :k].tolist() != draft_tokens.tolist():
                raise RuntimeError("the replayed lookup does not propose what the draft proposed")
            n = torch.Size([k + 1])
            p = warp_logits(target_logits, torch.full(n, self.temperature), torch.zeros(n, dtype=torch.int64), torch.ones(n))
            self.labels.append(p[torch.arange(k), draft_tokens.cpu()].float())
            self.features.append(lookup_features(int(matched[0]), int(offered[0]), self.temperature, self.recent, k))
            a = self.smoothing
            self.recent = a * self.recent + (1 - a) * int(out.num_accepted[0]) / k
        self.ids += out.tokens[0, : int(out.num_emitted[0])].tolist()


def collect_lookup_traces(target, tokenizer, chats: list[list[dict]], temperatures: list[float], max_new_tokens: int,
                          max_tokens: int) -> dict:
    """features [N, F], labels [N] (p_i(X_i)), prompt [N] (the chat's index) of every proposed token;
    overhead_s: the median seconds a round spends outside its target pass (lookup, verify, commit)."""
    features, labels, prompt, overhead = [], [], [], []
    jobs = [(i, chat, t) for i, chat in enumerate(chats) for t in temperatures]
    for i, chat, t in tqdm(jobs, desc="lookup traces"):
        ids = chat_ids(tokenizer, chat)
        recorder = LookupRecorder(ids, t, max_tokens)
        stats = fast_generate(target, PromptLookup(max_tokens=max_tokens), ids, max_new_tokens=max_new_tokens, temperature=t,
                              seed=i, policy=FixedDraftLength(max_tokens), on_round=recorder, guard=False).stats
        overhead.append((stats.wall_s - stats.prefill_s - stats.target_s) / max(stats.rounds, 1))
        if recorder.labels:
            features.append(torch.cat(recorder.features))
            labels.append(torch.cat(recorder.labels))
            prompt.append(torch.full((len(labels[-1]),), i))
    return dict(features=torch.cat(features), labels=torch.cat(labels), prompt=torch.cat(prompt),
                overhead_s=statistics.median(overhead))


def fit_acceptance(traces: dict, train: torch.Tensor, hidden: int, steps: int = 1500, lr: float = 3e-3) -> LookupAcceptance:
    net = LookupAcceptance(hidden)
    x, y = traces["features"][train], traces["labels"][train]
    net.mean.copy_(x.mean(0))
    net.std.copy_(x.std(0).clamp_min(1e-3))
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net.logits(x), y).backward()
        optimiser.step()
    return net.eval()


@torch.no_grad()
def calibration(net: LookupAcceptance, traces: dict, rows: torch.Tensor, bins: int = 5) -> list[dict]:
    """Predicted vs observed mean acceptance probability by predicted quantile, on ``rows``."""
    predicted, observed = net(traces["features"][rows]), traces["labels"][rows]
    order = predicted.argsort()
    return [dict(predicted=float(predicted[part].mean()), observed=float(observed[part].mean()), rows=len(part))
            for part in order.chunk(bins) if len(part)]


def run(out: Path, prompts: int, temperatures: list[float], max_new_tokens: int, max_tokens: int, hidden: int = 16) -> dict:
    """Trace, fit and save (see the module docstring); returns the file's metadata."""
    target, tokenizer = load_smollm2()
    use_fast_passes(target)
    chats = [chat for category in CATEGORIES for chat in workload_prompts(category, "tuning")[:prompts]]
    start = time.perf_counter()
    traces = collect_lookup_traces(target, tokenizer, chats, temperatures, max_new_tokens, max_tokens)
    seconds = pass_medians([(target, n) for n in range(1, max_tokens + 2)], chat_ids(tokenizer, chats[0]))
    intercept, slope = affine_fit(dict(enumerate(seconds[1:], 2)))
    target_pass_s = {1: seconds[0]} | {n: intercept + slope * n for n in range(2, max_tokens + 2)}
    round_s = {n: s + traces["overhead_s"] for n, s in target_pass_s.items()}  # what a round costs, pass and all
    train = traces["prompt"] % 5 != 4
    torch.manual_seed(0)
    net = fit_acceptance(traces, train, hidden)
    metadata = dict(draft="lookup", draft_step_s=LOOKUP_STEP_S, target_pass_s={str(n): s for n, s in round_s.items()},
                    round_overhead_s=traces["overhead_s"],
                    max_tokens=max_tokens, temperatures=temperatures, prompts=len(chats), rows=len(traces["labels"]),
                    calibration=calibration(net, traces, ~train), minutes=(time.perf_counter() - start) / 60)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_lookup_acceptance(out, net, metadata)
    return metadata
