"""The hybrid draft: prompt lookup where the context offers a match worth verifying, a draft
model elsewhere, chosen each round and for each sequence.

By default the loops choose by cost: a lookup of L tokens where its expected accepted tokens
(the shipped acceptance model of lookups) per second of verifying them, as measured on this
machine, beat the rate of the sequence's model rounds (``specdec_fast.policies.sources.
CostAwareSources``, calibrated by the loop). ``Hybrid(model, PromptLookup(), rule=True)`` looks up
by the fixed rule instead: whenever the longest earlier-seen suffix of the sequence is at least
``min_match`` tokens long; ``chooser`` takes any other chooser. The choice reads the committed
context and earlier rounds only, never the target's output of the round, so the output law is the
target's whatever it chooses (tested with the exact joint). :class:`HybridLM` is its cache: the
lookup sees every token; the model is fed only in the rounds it drafts, catching up on the tokens
committed since (its cache lags while the lookup drafts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..models.batched_lm import BatchedCachedLM, right_aligned
from .lookup import LookupLM, PromptLookup


@dataclass(frozen=True, eq=False)
class Hybrid:
    """Look up where it pays by the measured costs (the loops' default chooser), or with ``rule``
    where the context offers a suffix match of at least ``min_match`` tokens; else draft with ``model``.
    ``chooser``: one of your own (``choose(matched, offered, temperature) -> (looked_up, lengths)``,
    ``observe(accepted)``, ``reset(batch)``, ``select(rows)``)."""

    model: nn.Module
    lookup: PromptLookup = field(default_factory=PromptLookup)
    min_match: int = 2
    chooser: object | None = None
    rule: bool = False

    def __post_init__(self):
        if self.min_match < 1:
            raise ValueError(f"Hybrid.min_match must be positive, got {self.min_match}")
        if self.rule and self.chooser is not None:
            raise ValueError("Hybrid takes rule=True or a chooser, not both")


class HybridLM:
    """:class:`~specdec_fast.models.batched_lm.BatchedCachedLM` over a model draft's cache and a
    :class:`LookupLM`; ``looked_up`` [B] bool says which source each row drafts from this round: a
    looked-up row drafts what the lookup found (up to ``lookup.max_tokens``), a model row the round's
    length."""

    def __init__(self, model: BatchedCachedLM, lookup: LookupLM, min_match: int, chooser=None):
        self.model, self.lookup, self.min_match, self.chooser = model, lookup, min_match, chooser
        self.vocab_size, self.max_length = model.vocab_size, model.max_length
        self.device = getattr(model, "device", None) or lookup.device
        self.looked_up = torch.zeros(lookup.batch, dtype=torch.bool)
        self.lookup_lengths = torch.zeros(lookup.batch, dtype=torch.int64)  # the tokens each looked-up row drafts
        self.temperature = torch.ones(lookup.batch)
        self.first, self.model_drafts = False, True
        if chooser is not None:
            chooser.reset(lookup.batch)

    @property
    def lengths(self) -> Tensor:
        """[B] int64: tokens of each row seen (the lookup sees them all)."""
        return self.lookup.lengths

    @property
    def lookup_tokens(self) -> int:
        """The most tokens a looked-up row drafts in a round (the round draws uniforms for them)."""
        return self.lookup.draft.max_tokens

    def plan_lengths(self, lens: list[int], budgets: list[int]) -> list[int]:
        """A looked-up row drafts what it found (or what the chooser chose; up to its budget), a
        model row ``lens[b]``."""
        return [min(int(a), cap) if used else n
                for n, cap, a, used in zip(lens, budgets, self.lookup_lengths, self.looked_up.tolist())]

    @property
    def point_mass_rows(self) -> Tensor:
        """[B] bool: the rows looked up this round, whose drafts are point masses."""
        return self.looked_up

    def planned(self, width: int) -> Tensor:
        """[B, width]: the round's proposals at once, when every row is looked up (see LookupLM.planned)."""
        return self.lookup.planned(width)

    def begin_round(self, sampling=None, model: bool = True) -> None:
        """The next extend is a round's first (``sampling``: the round's settings, for the chooser);
        ``model``: whether the rows not looked up draft with the model this round (else they draft
        nothing, and the model is not run)."""
        self.lookup.begin_round()
        if sampling is not None:
            self.temperature = sampling.as_tensors(len(self.looked_up))[0]
        self.first, self.model_drafts = True, model

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        if self.chooser is not None:
            self.chooser.reset(self.lookup.batch)

    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        """Feed both sources as their rows need (see the module's docstring); returns logits
        [B, num_logits, V], each row's from the source it drafts from."""
        looked = self.lookup.extend(tokens, fed, num_logits)
        if self.first:
            self.first = False
            found = self.lookup.proposal_lengths
            if self.chooser is None:
                self.looked_up, self.lookup_lengths = (self.lookup.matched >= self.min_match) & (found > 0), found
            else:
                self.looked_up, self.lookup_lengths = self.chooser.choose(self.lookup.matched, found, self.temperature)
            history = self.lookup.index.tokens
            seen, total = self.model.lengths.tolist(), self.lookup.lengths.tolist()
            tokens, fed = right_aligned([[] if used else history[b, seen[b]: total[b]].tolist()
                                         for b, used in enumerate(self.looked_up.tolist())])
            num_logits = 1
        else:
            fed = fed.cpu() & ~self.looked_up[:, None]
        if bool(self.looked_up.all()):
            return looked
        if not self.model_drafts:  # the other rows draft nothing: finite logits that no draft reads
            return looked.masked_fill(~self.looked_up.to(looked.device)[:, None, None], 0.0)
        modelled = self.model.extend(tokens, fed, num_logits)
        return torch.where(self.looked_up.to(modelled.device)[:, None, None], looked[:, -num_logits:].to(modelled.device),
                           modelled)

    def keep(self, lengths: Tensor) -> None:
        if self.chooser is not None:
            self.chooser.observe(lengths.cpu() - self.lookup.index.indexed)
        self.lookup.keep(lengths)
        self.model.keep(torch.minimum(self.model.lengths.to(lengths.device), lengths))

    def select(self, rows: Tensor) -> None:
        self.lookup.select(rows)
        self.model.select(rows)
        self.looked_up, self.lookup_lengths = self.looked_up[rows.cpu()], self.lookup_lengths[rows.cpu()]
        self.temperature = self.temperature[rows.cpu()]
        if self.chooser is not None:
            self.chooser.select(rows.tolist())
