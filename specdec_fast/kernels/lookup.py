"""Prompt-lookup ops: an n-gram index of each sequence's committed tokens and the proposal of
the continuation of its longest earlier-seen suffix (csrc/cpu/lookup.h).

The reference (:func:`lookup_propose_reference`) is the definition, by search: the longest
suffix of n <= max_n tokens (n >= min_n) that occurred earlier, ending before the last token,
and the tokens after its most recent occurrence. The ``cpu`` kernel answers the same from an
index updated in O(max_n) per committed token, in a table of ``capacity`` entries per
sequence; a newer n-gram that lands in an occupied slot evicts the older one, so with many
n-grams per slot it may miss a match the search finds (a draft's quality, never the output's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import registry  # noqa: F401  the ops' schemas
from .backends import resolve

MAX_N = 8  # csrc/cpu/lookup.h kLookupMaxN


def lookup_propose_reference(tokens: list[int], min_n: int, max_n: int, k: int, indexed: int | None = None,
                             source: list[int] | None = None) -> tuple[list[int], int]:
    """(up to k tokens continuing the longest suffix of ``tokens`` seen before, the suffix length
    n; ([], 0) without a match): n from max_n down to min_n, the most recent occurrence in
    ``source`` (default: ``tokens`` itself; or a corpus) among those followed by one of its first
    ``indexed`` tokens (default: all)."""
    length = len(tokens)
    source = tokens if source is None else source
    last_end = min(len(source), indexed if indexed is not None else len(source)) - 1  # an occurrence ends before a token
    for n in range(min(max_n, length), max(min_n, 1) - 1, -1):
        suffix = tokens[length - n:]
        for end in range(last_end, n - 1, -1):  # the occurrence source[end - n:end], most recent first
            if source[end - n: end] == suffix:
                return source[end: end + k], n
    return [], 0


class LookupIndex:
    """The n-gram index of B sequences: ``tokens`` [B, H] int64 (row b's first ``lengths[b]``
    entries are its sequence), ``indexed`` [B] (how many are in the index), and the tables."""

    def __init__(self, batch: int, capacity: int = 1 << 16, max_n: int = 4, backend: str = "auto"):
        if capacity <= 0 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two, got {capacity}")
        if not 1 <= max_n <= MAX_N:
            raise ValueError(f"max_n must be in 1..{MAX_N}, got {max_n}")
        self.max_n, self.backend = max_n, resolve(backend, torch.device("cpu"))
        self.tokens = torch.zeros(batch, 256, dtype=torch.int64)
        self.lengths = torch.zeros(batch, dtype=torch.int64)
        self.indexed = torch.zeros(batch, dtype=torch.int64)
        self.keys = torch.zeros(batch, capacity, dtype=torch.int64)
        self.next = torch.zeros(batch, capacity, dtype=torch.int64)

    def append(self, row: int, tokens: list[int] | Tensor) -> None:
        """Add ``tokens`` (a list or an int64 tensor) to sequence ``row`` (not yet to the index: see :meth:`commit`)."""
        start = int(self.lengths[row])
        end = start + len(tokens)
        if end > self.tokens.shape[1]:
            grown = torch.zeros(self.tokens.shape[0], max(end, 2 * self.tokens.shape[1]), dtype=torch.int64)
            grown[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = grown
        self.tokens[row, start:end] = torch.as_tensor(tokens, dtype=torch.int64)
        self.lengths[row] = end

    def truncate(self, lengths: Tensor) -> None:
        """Keep the first ``lengths[b]`` tokens of each row (never below what is indexed)."""
        self.lengths = torch.minimum(self.lengths, lengths.cpu())
        if bool((self.lengths < self.indexed).any()):
            raise ValueError("cannot drop tokens that are in the lookup index (only uncommitted drafts can be dropped)")

    def commit(self) -> None:
        """Index every row's tokens up to its length."""
        if self.backend == "cpu":
            torch.ops.specdec_fast.lookup_add(self.tokens, self.indexed, self.lengths, self.keys, self.next, self.max_n)
        self.indexed = self.lengths.clone()

    def propose(self, k: int, min_n: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """(proposals [B, k] int64, -1 past a row's count; counts [B]; matched suffix lengths [B]):
        what continues each row's longest suffix, among the occurrences in the index."""
        if self.backend == "cpu":
            return torch.ops.specdec_fast.lookup_propose(self.tokens, self.lengths, self.keys, self.next, min_n, self.max_n, k)
        return self._reference(self.tokens, self.lengths, k, min_n, lambda b: (None, int(self.indexed[b])))

    def propose_in(self, tokens: Tensor, lengths: Tensor, k: int, min_n: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`propose` for other sequences (``tokens`` [B, H], ``lengths`` [B]) searched in this
        index's one row (a corpus: batch 1), among its indexed tokens."""
        if len(self.lengths) != 1:
            raise ValueError(f"propose_in searches one shared sequence, this index holds {len(self.lengths)}")
        tokens, lengths = tokens.contiguous(), lengths.cpu()
        if self.backend == "cpu":
            return torch.ops.specdec_fast.lookup_propose_in(tokens, lengths, self.tokens, self.indexed, self.keys,
                                                            self.next, min_n, self.max_n, k)
        source = self.tokens[0, : int(self.indexed[0])].tolist()
        return self._reference(tokens, lengths, k, min_n, lambda b: (source, None))

    def _reference(self, tokens: Tensor, lengths: Tensor, k: int, min_n: int, where) -> tuple[Tensor, Tensor, Tensor]:
        """The proposals by search (the torch backend); where(b) = (source, indexed) of row b."""
        out = torch.full((len(lengths), k), -1, dtype=torch.int64)
        counts, matched = torch.zeros(len(lengths), dtype=torch.int64), torch.zeros(len(lengths), dtype=torch.int64)
        for b in range(len(lengths)):
            source, indexed = where(b)
            found, n = lookup_propose_reference(tokens[b, : int(lengths[b])].tolist(), min_n, self.max_n, k, indexed, source)
            out[b, : len(found)], counts[b], matched[b] = torch.tensor(found, dtype=torch.int64), len(found), n
        return out, counts, matched

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` of the batch."""
        rows = rows.cpu()
        for name in ("tokens", "lengths", "indexed", "keys", "next"):
            setattr(self, name, getattr(self, name)[rows])
