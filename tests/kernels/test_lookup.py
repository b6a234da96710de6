"""Prompt-lookup ops (csrc/cpu/lookup.h) against the search that defines them
(``lookup_propose_reference``): the longest earlier-seen suffix, its most recent occurrence,
committed in any number of steps, several rows at once; and the bad inputs they refuse."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_fast.kernels import SamplingParams, draft_step, point_mass_step
from specdec_fast.kernels.lookup import LookupIndex, lookup_propose_reference


def test_the_reference_is_the_longest_most_recent_match():
    tokens = [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert lookup_propose_reference(tokens, 1, 3, 4) == ([4, 7, 1, 2], 2)  # "1 2" last seen before position 7
    assert lookup_propose_reference(tokens, 3, 3, 4) == ([], 0)  # the 3-gram "7 1 2" has no earlier occurrence
    assert lookup_propose_reference([3, 3], 1, 2, 5) == ([3], 1)
    assert lookup_propose_reference([8], 1, 3, 5) == ([], 0)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_the_index_proposes_what_the_search_finds(backend):
    rng = random.Random(0)
    rows = [[rng.randrange(5) for _ in range(rng.randrange(1, 80))] for _ in range(40)]
    index = LookupIndex(len(rows), capacity=1 << 12, max_n=3, backend=backend)
    done = [0] * len(rows)
    for step in range(3):  # commit each row in three uneven steps
        for b, tokens in enumerate(rows):
            end = len(tokens) if step == 2 else rng.randrange(done[b], len(tokens) + 1)
            index.append(b, tokens[done[b]: end])
            done[b] = end
        index.commit()
        out, counts, matched = index.propose(6, min_n=1)
        for b, tokens in enumerate(rows):
            expected, n = lookup_propose_reference(tokens[: done[b]], 1, 3, 6)
            assert out[b, : int(counts[b])].tolist() == expected and int(matched[b]) == n
            assert (out[b, int(counts[b]):] == -1).all()


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_a_shared_index_proposes_what_the_search_finds_in_it(backend):
    """propose_in: other sequences' suffixes searched in one corpus (lookup_propose_in)."""
    rng = random.Random(1)
    corpus = [rng.randrange(6) for _ in range(300)]
    index = LookupIndex(1, capacity=1 << 16, max_n=3, backend=backend)  # (1 << 12 evicts a 3-gram this test queries)
    index.append(0, corpus[:200])
    index.commit()
    index.append(0, corpus[200:])  # not committed: not searched
    queries = [[rng.randrange(6) for _ in range(rng.randrange(1, 20))] for _ in range(30)]
    tokens = torch.zeros(len(queries), 20, dtype=torch.int64)
    for b, q in enumerate(queries):
        tokens[b, : len(q)] = torch.tensor(q)
    out, counts, matched = index.propose_in(tokens, torch.tensor([len(q) for q in queries]), 5, min_n=2)
    for b, q in enumerate(queries):
        expected, n = lookup_propose_reference(q, 2, 3, 5, indexed=200, source=corpus[:200])
        assert out[b, : int(counts[b])].tolist() == expected and int(matched[b]) == n


def test_drafted_tokens_are_dropped_and_never_indexed():
    index = LookupIndex(1, capacity=1 << 8, max_n=2)
    index.append(0, [1, 2, 3, 1, 2])
    index.commit()
    index.append(0, [9, 9])  # drafted, then rejected
    index.truncate(torch.tensor([5]))
    index.commit()
    out, counts, _ = index.propose(3)
    assert out[0, : int(counts[0])].tolist() == [3, 1, 2]
    with pytest.raises(ValueError, match="cannot drop tokens that are in the lookup index"):
        index.truncate(torch.tensor([4]))


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        LookupIndex(1, capacity=1000)
    with pytest.raises(ValueError, match="max_n must be in 1..8"):
        LookupIndex(1, max_n=9)
    index = LookupIndex(1)
    with pytest.raises(RuntimeError, match="lookup_add: row 0 indexes tokens"):
        torch.ops.specdec_fast.lookup_add(index.tokens, torch.tensor([3]), torch.tensor([1]), index.keys, index.next, 2)


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.7, top_k=3, top_p=0.8), SamplingParams(0.0)])
def test_a_point_mass_step_is_the_draft_step_of_its_logits(sampling):
    """What a lookup's round uses instead of draft_step: the same tokens, q(token), entropy and top-1;
    q itself is not materialised (the draft step's q is the one-hot the verifier assumes)."""
    tokens = torch.tensor([4, 0, 99])
    logits = torch.full((3, 100), float("-inf"))
    logits[torch.arange(3), tokens] = 0.0
    expected = draft_step(logits, sampling=sampling, seed=0)
    got = point_mass_step(tokens)
    assert got.probs is None
    torch.testing.assert_close(expected.probs, torch.nn.functional.one_hot(tokens, 100).float(), rtol=0, atol=0)
    for name in ("tokens", "token_prob", "entropy", "top1_prob"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=0, atol=1e-6)
