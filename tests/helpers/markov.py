"""A synthetic target/draft pair whose next-token distribution depends on the position and
the previous token, so a verifier can be checked against the exact target distribution.

One trial: draft up to K tokens from the draft chain, verify them, then complete the
sequence to K+1 tokens by sampling the target chain. If the verifier is lossless the K+1
tokens follow the target chain exactly, whatever the draft and the draft lengths.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import Tensor

from specdec_fast.kernels import warp_logits

from helpers.distribution import chi_square, counts

START = 0  # the "previous token" before position 0
SAMPLING = {  # name: (top_k, top_p)
    "plain": (0, 1.0),
    "top_k": (3, 1.0),
    "top_p": (0, 0.8),
    "top_k+top_p": (5, 0.9),
}
# (temperature, K, V) of the chi-square grid; the fast tier runs one cell per sampling setting.
GRID = [pytest.param(t, k, v, marks=[] if (t, k) == (1.0, 3) else [pytest.mark.slow])
        for t in (0.7, 1.0, 1.5) for k, v in ((1, 64), (3, 16), (5, 8))]


@dataclass
class MarkovPair:
    target_logits: Tensor  # [K+1, V, V]: position, previous token -> logits
    draft_logits: Tensor  # [K, V, V]
    temperature: float
    top_k: int
    top_p: float

    def warp(self, logits: Tensor) -> Tensor:
        n = logits.shape[:-1]
        return warp_logits(
            logits,
            torch.full(n, self.temperature),
            torch.full(n, self.top_k, dtype=torch.int64),
            torch.full(n, self.top_p),
        )

    @property
    def k(self) -> int:
        return self.draft_logits.shape[0]


def grid_pair(temperature: float, k: int, vocab: int, sampling: str, salt: str = "") -> tuple[MarkovPair, int]:
    """(the pair of one GRID cell with SAMPLING[sampling], the seed of its trials)."""
    seed = zlib.crc32(f"{salt}{k},{vocab},{temperature},{sampling}".encode())
    return make_pair(k, vocab, temperature, *SAMPLING[sampling], seed), seed + 1


def make_pair(k: int, vocab: int, temperature: float, top_k: int, top_p: float, seed: int) -> MarkovPair:
    g = torch.Generator().manual_seed(seed)
    target = 2.0 * torch.randn(k + 1, vocab, vocab, generator=g)
    draft = target[:k] + 1.5 * torch.randn(k, vocab, vocab, generator=g)  # related but different
    return MarkovPair(target, draft, temperature, top_k, top_p)


def run_trials(pair: MarkovPair, verify_fn: Callable, trials: int, seed: int) -> Tensor:
    """Sequences [trials, K+1] produced by drafting, ``verify_fn`` and target completion.

    ``verify_fn(target_logits, draft_probs, draft_tokens, draft_lens, generator)`` returns
    a VerifyOutput. Draft lengths are uniform in [0, K], so every batch is ragged.
    """
    g = torch.Generator().manual_seed(seed)
    k, vocab = pair.k, pair.target_logits.shape[-1]
    lens = torch.randint(0, k + 1, (trials,), generator=g)

    prev = torch.full((trials,), START)
    draft_tokens, draft_probs, target_logits = [], [], []
    for i in range(k + 1):
        target_logits.append(pair.target_logits[i, prev])
        if i == k:
            break
        q = pair.warp(pair.draft_logits[i, prev])
        x = torch.multinomial(q, 1, generator=g).squeeze(-1)
        draft_probs.append(q)
        draft_tokens.append(x)
        prev = x
    out = verify_fn(
        torch.stack(target_logits, 1),
        torch.stack(draft_probs, 1) if k else torch.zeros(trials, 0, vocab),
        torch.stack(draft_tokens, 1) if k else torch.zeros(trials, 0, dtype=torch.int64),
        lens,
        g,
    )
    assert (out.num_emitted == out.num_accepted + 1).all()
    assert ((out.num_accepted >= 0) & (out.num_accepted <= lens)).all()

    seq = out.tokens.clone()
    for i in range(k + 1):  # complete each sequence from the target chain
        prev = seq[:, i - 1] if i > 0 else torch.full((trials,), START)
        fresh = torch.multinomial(pair.warp(pair.target_logits[i, prev]), 1, generator=g).squeeze(-1)
        seq[:, i] = torch.where(i < out.num_emitted, seq[:, i], fresh)
    assert ((seq >= 0) & (seq < vocab)).all()
    return seq


def exact_marginals(pair: MarkovPair) -> list[Tensor]:
    """Exact marginal of the target chain at each position 0..K, each [V]."""
    p = pair.warp(pair.target_logits)  # [K+1, V(prev), V]
    marginals = [p[0, START]]
    for i in range(1, pair.k + 1):
        marginals.append(marginals[-1] @ p[i])
    return marginals


def failing_positions(pair: MarkovPair, seq: Tensor) -> list[str]:
    """Chi-square of every position's marginal and of every adjacent pair's joint;
    the list of those that fail (empty if the samples follow the target chain)."""
    vocab = pair.target_logits.shape[-1]
    p = pair.warp(pair.target_logits)
    marginals = exact_marginals(pair)
    failures = []
    for i in range(pair.k + 1):
        stat, threshold, df = chi_square(counts(seq[:, i], vocab), marginals[i])
        if stat > threshold:
            failures.append(f"position {i}: chi2 {stat:.1f} > {threshold:.1f} (df {df})")
        if i > 0:
            joint = marginals[i - 1][:, None] * p[i]  # [prev, next]
            stat, threshold, df = chi_square(counts(seq[:, i - 1] * vocab + seq[:, i], vocab * vocab), joint)
            if stat > threshold:
                failures.append(f"positions {i - 1},{i}: chi2 {stat:.1f} > {threshold:.1f} (df {df})")
    return failures


class BigramLM:
    """A model outside transformers that implements the CachedLM protocol: logits = table[last token].

    Cheap enough for losslessness tests of thousands of fast_generate runs whose subject is
    not the model (e.g. a draft-length policy)."""

    def __init__(self, table: Tensor):
        self.table, self.vocab_size, self.max_length = table, table.shape[0], None
        self.tokens: list[int] = []

    @property
    def cache_length(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens = []

    def extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        self.tokens += tokens.tolist()
        return self.table[torch.tensor(self.tokens[-num_logits:])]

    def crop(self, length: int) -> None:
        del self.tokens[length:]


class SiblingBigramLM(BigramLM):
    """A BigramLM that also scores first-token alternatives (the two members they need)."""

    def extend_siblings(self, tokens: Tensor, siblings: Tensor, at: int, num_logits: int) -> Tensor:
        """As HFCachedLM's: ``tokens``, then ``siblings`` (alternatives to tokens[at]) cached after them;
        a bigram's logits after a sibling are its own row."""
        logits = self.extend(tokens, num_logits)
        self.tokens += siblings.tolist()
        return torch.cat([logits, self.table[siblings]])

    def keep_sibling(self, length: int, slot: int) -> None:
        self.tokens[length - 1] = self.tokens[slot]
        self.crop(length)


def bigram_pair(vocab: int, seed: int, siblings: bool = False) -> tuple[BigramLM, BigramLM]:
    """(target, draft): random bigram tables, the draft's related to the target's but different;
    ``siblings``: the target scores first-token alternatives."""
    g = torch.Generator().manual_seed(seed)
    target = 2.0 * torch.randn(vocab, vocab, generator=g)
    lm = SiblingBigramLM if siblings else BigramLM
    return lm(target), BigramLM(target + 1.5 * torch.randn(vocab, vocab, generator=g))


def bigram_joint(lm: BigramLM, last_token: int, n_tokens: int, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0) -> Tensor:
    """P(the next n_tokens = z) after ``last_token`` under the warped table, for every z:
    [V ** n_tokens], z flattened as ((z_0 V + z_1) V + z_2) ..."""
    rows = lm.vocab_size
    p = warp_logits(lm.table, torch.full((rows,), temperature), torch.full((rows,), top_k), torch.full((rows,), top_p)).double()
    joint = p[last_token][None]  # [prefixes, last token]
    for _ in range(n_tokens - 1):
        joint = (joint[:, :, None] * p[None]).reshape(-1, lm.vocab_size)
    return joint.flatten()
