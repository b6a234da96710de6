"""Prompt lookup: a draft that copies from the context, at no training cost.

Pass a :class:`PromptLookup` as the draft of ``fast_generate`` or ``batch_generate``. Each
round it proposes the tokens that followed the most recent earlier occurrence of the
sequence's longest suffix (up to ``max_n`` tokens, at least ``min_n``) in the prompt and the
text generated so far (:mod:`specdec_fast.kernels.lookup`); a row without such a suffix drafts
nothing that round (the target emits one token). A proposed token is a point mass: q = 1 on
it, so it is accepted with probability p(x) and a rejection resamples from p with x removed,
which keeps the output exactly the target's.

:class:`LookupLM` is its cache for the loops (:class:`~specdec_fast.models.batched_lm.BatchedCachedLM`
of B rows). ``proposal_lengths`` tells the round how many tokens each row has to offer, and
``planned`` hands them over at once: the verifier takes them as point masses (``draft_probs=None``),
so a lookup round runs no draft step. Its logits (0 at the proposed token, -inf elsewhere, so a
draft step samples the proposal at any temperature, top-k or top-p) serve the rounds of a
:class:`~specdec_fast.drafts.hybrid.HybridLM` that mix looked-up and modelled rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import Tensor

from ..kernels.lookup import MAX_N, LookupIndex


class LookupCorpus:
    """Text that every :class:`PromptLookup` holding it may copy from, beyond each sequence's own
    context: documents the user adds (:meth:`add`, :meth:`add_texts`), and, with ``learn``, the
    tokens of every request a loop finishes (prompt and output, as SuffixDecoding shares text
    across requests). A sequence takes the corpus's proposal when its match is longer than the
    one in its own context.

    Memory is bounded: an index of ``capacity`` entries (a power of two, 16 bytes each) over at
    most ``max_tokens`` tokens (8 bytes each); text past that is not added (``full`` says so).
    """

    def __init__(self, max_n: int = 4, capacity: int = 1 << 20, max_tokens: int = 1 << 22, learn: bool = True):
        if max_tokens < 1:
            raise ValueError(f"LookupCorpus.max_tokens must be positive, got {max_tokens}")
        self.index = LookupIndex(1, capacity, max_n)
        self.max_tokens, self.learn, self.full = max_tokens, learn, False

    def __len__(self) -> int:
        """Tokens in the corpus."""
        return int(self.index.lengths[0])

    def add(self, tokens: Sequence[int] | Tensor) -> None:
        """Append one document's token ids (indexed at once), unless the corpus would pass max_tokens."""
        tokens = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
        if len(self) + len(tokens) > self.max_tokens:
            self.full = True
            return
        self.index.append(0, tokens)
        self.index.commit()

    def add_texts(self, tokenizer, texts: Iterable[str]) -> None:
        """Append each text, tokenized without special tokens."""
        for text in texts:
            self.add(tokenizer(text, add_special_tokens=False)["input_ids"])

    def propose(self, tokens: Tensor, lengths: Tensor, k: int, min_n: int) -> tuple[Tensor, Tensor, Tensor]:
        """(proposals [B, k], counts [B], matched suffix lengths [B]) for the sequences ``tokens``
        [B, H] of ``lengths`` [B], from the corpus (see :meth:`LookupIndex.propose_in`)."""
        return self.index.propose_in(tokens, lengths, k, min_n)


@dataclass(frozen=True)
class PromptLookup:
    """A draft that proposes continuations of the context's longest earlier-seen suffix.

    max_n, min_n: the longest and shortest suffix matched (1 <= min_n <= max_n <= 8).
    max_tokens: the most tokens proposed in one round (the round's draft length caps it too).
    capacity: index entries per sequence (a power of two; 16 bytes each), bounding its memory.
    corpus: a :class:`LookupCorpus` to copy from too (other requests' text, documents).
    """

    max_n: int = 3
    min_n: int = 1
    max_tokens: int = 16
    capacity: int = 1 << 16
    corpus: LookupCorpus | None = None

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n <= MAX_N:
            raise ValueError(f"PromptLookup needs 1 <= min_n <= max_n <= {MAX_N}, got min_n={self.min_n}, max_n={self.max_n}")
        if self.max_tokens < 1:
            raise ValueError(f"PromptLookup.max_tokens must be positive, got {self.max_tokens}")


class LookupLM:
    """The cache of a :class:`PromptLookup` for ``batch`` sequences over a vocabulary of
    ``vocab_size`` (see the module's docstring). Committed tokens (those below the lengths that
    ``keep`` keeps) are indexed; drafted ones are held until ``keep`` drops or commits them."""

    def __init__(self, draft: PromptLookup, vocab_size: int, batch: int = 1, max_length: int | None = None,
                 device: torch.device | str = "cpu"):
        self.draft, self.vocab_size, self.max_length, self.batch = draft, vocab_size, max_length, batch
        self.device = torch.device(device)  # where its logits go (the target's); the index stays on the CPU
        self.reset()

    def reset(self) -> None:
        """Forget every sequence."""
        self.index = LookupIndex(self.batch, self.draft.capacity, self.draft.max_n)
        self.plan = torch.full((self.batch, self.draft.max_tokens), -1, dtype=torch.int64)
        self.proposal_lengths = torch.zeros(self.batch, dtype=torch.int64)
        self.matched = torch.zeros(self.batch, dtype=torch.int64)  # the suffix length each proposal continues
        self.step = None  # the plan's token the next extend answers with; -1: commit and propose first; None: no round

    @property
    def lengths(self) -> Tensor:
        """[B] int64: tokens of each row held (committed and drafted)."""
        return self.index.lengths.clone()

    @property
    def point_mass_rows(self) -> Tensor:
        """[B] bool: the rows whose drafts are point masses (all of a lookup's)."""
        return torch.ones(self.batch, dtype=torch.bool)

    def plan_lengths(self, lens: list[int], budgets: list[int]) -> list[int]:
        """The round's draft lengths once the lookup has looked: at most what each row found."""
        return [min(n, int(a)) for n, a in zip(lens, self.proposal_lengths)]

    def planned(self, width: int) -> Tensor:
        """[B, width] int64: the round's proposals at once (after the round's first extend), 0 past a
        row's count (never verified), on the device the verifier runs on. The rows' caches are not
        fed the drafted tokens: the next round's first extend feeds the committed ones."""
        self.step = None
        return self.plan[:, :width].clamp(min=0).to(self.device)

    def begin_round(self, sampling=None) -> None:
        """The next :meth:`extend` feeds committed tokens only (a round's first): index them and
        propose from the sequence they end."""
        self.step = -1

    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        """Append each row's fed tokens (``tokens`` [B, n], ``fed`` [B, n] bool); returns logits
        [B, num_logits, V]: the last column a point mass on the row's next proposed token (the
        first extend of a round, after :meth:`begin_round`, commits and proposes; later ones step
        through the proposal), the other columns zeros (a lookup has no distribution there)."""
        tokens, fed = tokens.cpu(), fed.cpu()
        for b in range(tokens.shape[0]):
            self.index.append(b, tokens[b] if bool(fed[b].all()) else tokens[b][fed[b]])
        if self.step == -1:
            self.index.commit()
            self.plan, self.proposal_lengths, self.matched = self.propose()
            self.step = 0
        wanted = self.plan[:, min(self.step or 0, self.plan.shape[1] - 1)].clamp(min=0)  # past a proposal: token 0, never verified
        self.step = None if self.step is None else self.step + 1
        logits = torch.full((tokens.shape[0], num_logits, self.vocab_size), float("-inf"))  # built on the CPU, moved once
        logits[:, :-1] = 0.0
        logits[:, -1].scatter_(-1, wanted[:, None], 0.0)
        return logits.to(self.device)

    def propose(self) -> tuple[Tensor, Tensor, Tensor]:
        """(plan [B, max_tokens], counts [B], matched [B]): each row's own-context proposal, or the
        corpus's where its match is longer."""
        own = self.index.propose(self.draft.max_tokens, self.draft.min_n)
        if self.draft.corpus is None or len(self.draft.corpus) == 0:
            return own
        corpus = self.draft.corpus.propose(self.index.tokens, self.index.lengths, self.draft.max_tokens, self.draft.min_n)
        longer = corpus[2] > own[2]
        return tuple(torch.where(longer.reshape(-1, *[1] * (a.dim() - 1)), b, a) for a, b in zip(own, corpus))

    def keep(self, lengths: Tensor) -> None:
        """Keep the first ``lengths[b]`` tokens of row b (the drafts past them are dropped; the kept
        ones are committed and the next round's first extend indexes them)."""
        self.index.truncate(lengths)
        self.step, self.proposal_lengths = None, torch.zeros_like(self.proposal_lengths)

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` ([B'] int64 indices) of the batch."""
        rows = rows.cpu()
        self.index.select(rows)
        self.plan, self.proposal_lengths, self.matched = self.plan[rows], self.proposal_lengths[rows], self.matched[rows]
        self.batch = len(rows)


def remember(draft, sequences: Iterable[Sequence[int]]) -> None:
    """Add finished requests' token ids to the corpus of ``draft`` (a :class:`PromptLookup`, or a
    hybrid's lookup) when it has one that learns; any other draft: nothing."""
    lookup = getattr(draft, "lookup", draft)
    corpus = getattr(lookup, "corpus", None) if isinstance(lookup, PromptLookup) else None
    if corpus is not None and corpus.learn:
        for tokens in sequences:
            corpus.add(tokens)
