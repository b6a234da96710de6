"""One round of speculative decoding for every running sequence: draft, verify, commit.

Invariant before a round, per sequence with n committed tokens: the target's cache holds the
first n - 1 of them, the draft's a prefix of them. A round

1. drafts X_1..X_k, X_i ~ q_i, one draft pass per position (the first pass also catches the
   draft up on committed tokens it has not seen);
2. runs the target once over [last committed, X_1..X_k], which gives p_1..p_{k+1}; the
   verifier accepts a prefix of the drafts and draws one more token, so that what the round
   emits follows the target's distribution exactly;
3. commits the accepted drafts and that token, and rolls both caches back to what is still
   valid (nothing is recomputed).

Every sequence draws its uniforms from its own generator, in the same order whatever else is
in the batch, so with a fixed draft length a request's output does not depend on the batch.
One sequence runs through the same round as a batch of one (:class:`~specdec_fast.models.
batched_lm.OneSequence`); only it lets the policy stop drafting token by token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels import SamplingParams, VerifyOutput, draft_step, point_mass_step, verify
from ..kernels.backends import resolve
from ..kernels.sampling import draw_uniforms
from ..models.batched_lm import BatchedCachedLM, right_aligned
from ..policies.mdp import DraftPolicy
from .requests import Request, until_eos


@dataclass
class Drafts:
    """A round's drafts for B rows. tokens [B, k] int64 and probs [B, k, V] (the q each token was
    drawn from; None when every row's tokens are point masses, a lookup's), k = max(lens);
    lens: tokens drafted per row (ragged); passes: draft passes run; first_logits [B, V]: the
    draft's logits at the first position (None if nothing was drafted); point_mass [B] bool: the
    rows whose tokens are point masses (None if none are), whose probs rows are never read."""

    tokens: Tensor
    probs: Tensor | None
    lens: list[int]
    passes: int = 0
    first_logits: Tensor | None = None
    withheld: bool = False  # the policy declined to verify the first drafted token
    point_mass: Tensor | None = None

    @property
    def spent(self) -> bool:
        """Whether the round spent drafting work: it drafted a token, or its draft pass ran and the
        policy withheld the token. A lookup that found nothing spent nothing: its round is a plain one."""
        return self.withheld or any(self.lens)

    def dense_probs(self, vocab: int) -> Tensor:
        """probs [B, k, V], with the point-mass rows one-hot (for callbacks that read q)."""
        if self.probs is not None and self.point_mass is None:
            return self.probs
        one_hot = torch.nn.functional.one_hot(self.tokens.clamp(min=0), vocab).float()
        if self.probs is None:
            return one_hot
        return torch.where(self.point_mass[:, None, None].to(self.probs.device), one_hot.to(self.probs.device), self.probs)


@dataclass
class Verified:
    """A round's verification: the target's logits [B, k + 1, V] over [last, X_1..X_k], the draft
    probabilities [B, k, V] on the target's device (None when every row's drafts are point masses),
    and the verifier's output; accepted and tokens are its counts and emitted tokens read to the host."""

    target_logits: Tensor
    draft_probs: Tensor | None
    out: VerifyOutput
    accepted: list[int]
    tokens: list[list[int]]


@dataclass
class Round:
    """What a round did: its drafts, their verification, the tokens each row committed, and its
    seconds (drafting; the target pass, verification and commit)."""

    drafts: Drafts
    verified: Verified
    committed: list[list[int]]
    draft_s: float
    target_s: float


def load_kernels(lm) -> None:
    """Build (the first time) and load the kernels for ``lm``'s device, before any clock starts, so
    a build is never billed to a generation."""
    resolve("auto", torch.device(getattr(lm, "device", None) or "cpu"))


def prefill(target: BatchedCachedLM, draft: BatchedCachedLM | None, seqs: list[Request]) -> None:
    """Fill both caches with every sequence's prompt but its last token (the target's first: a
    feature draft reads the target's features), so the first round costs what later rounds do."""
    if max(len(s.ids) for s in seqs) > 1:
        for lm in (target, draft) if draft is not None else (target,):
            lm.extend(*right_aligned([s.ids[:-1] for s in seqs]), 1)
        for s in seqs:
            s.stats.target_calls += 1
            s.stats.draft_calls += draft is not None


def padded(rows: list[Tensor], width: int) -> Tensor:
    """Uniforms [n_b] per row -> [B, width], padded with 1 (a valid, unused uniform)."""
    out = torch.ones(len(rows), width)
    for b, u in enumerate(rows):
        out[b, : len(u)] = u
    return out


def draft_chain(draft: BatchedCachedLM, seqs: list[Request], lens: list[int], uniforms: list[Tensor],
                sampling: SamplingParams, eos: set[int], policy: DraftPolicy | None = None) -> Drafts:
    """Draft up to lens[b] tokens for row b with uniforms[b] [>= lens[b]] (a hybrid's looked-up rows
    up to len(uniforms[b]), even where every lens[b] is 0: its model then does not run). A row stops at EOS; with
    ``policy`` (one sequence only) the policy may decline to verify the first token (withheld:
    lens becomes 0) or stop after any token. Stops when every row has stopped.

    A lookup draft (``plan_lengths``) sets each row's length once it has looked: at most what it
    found, and for the rows a hybrid looks up for, up to len(uniforms[b]) whatever lens says. Its
    ``point_mass_rows`` [B] bool says which rows' tokens are point masses; when all are,
    ``planned(n)`` [B, n] gives the round's tokens at once: no draft step, no pass over the
    vocabulary, no q (the policy is asked about the first token only: a fixed proposal tells it
    nothing new token by token)."""
    budgets = [len(u) for u in uniforms]
    lens, width = list(lens), max(budgets, default=0)
    tokens, probs, first_logits, passes, withheld, point_mass = [], [], None, 0, False, None
    u = padded(uniforms, width)
    if width:  # no uniforms: no speculation this round, from any source
        seen = draft.lengths.tolist()
        if hasattr(draft, "lookup_tokens"):  # a hybrid: its model drafts only where lens allow
            draft.begin_round(sampling, model=bool(max(lens, default=0)))
        elif hasattr(draft, "begin_round"):  # a lookup draft: what it is fed now is committed
            draft.begin_round(sampling)
        logits = draft.extend(*right_aligned([s.ids[m:] for s, m in zip(seqs, seen)]), 1)[:, -1]
        first_logits, passes = logits, 1
        if hasattr(draft, "plan_lengths"):
            lens = draft.plan_lengths(lens, budgets)
            rows = draft.point_mass_rows
            point_mass = rows if bool(rows.any()) else None
            if bool(rows.all()):
                return looked_up_drafts(draft.planned(max(lens, default=0)), lens, passes, first_logits, rows, eos,
                                        sampling, policy)
    width = max(lens, default=0)
    for i in range(width):
        step = draft_step(logits, sampling=sampling, uniforms=u[:, i].to(logits.device))
        if policy is not None and i == 0 and not policy.propose_first(step, float(sampling.temperature)):
            lens[0], withheld = 0, True
            break
        tokens.append(step.tokens)
        probs.append(step.probs)
        for b, token in enumerate(step.tokens.tolist()):
            if token in eos and i < lens[b]:
                lens[b] = i + 1
        if policy is not None and i + 1 < lens[0] and not policy.continue_drafting(i, step, float(sampling.temperature)):
            lens[0] = i + 1
        if all(n <= i + 1 for n in lens):
            break
        logits = draft.extend(step.tokens[:, None], torch.ones(len(seqs), 1, dtype=torch.bool), 1)[:, -1]
        passes += 1
    k = max(lens, default=0)
    if k:
        return Drafts(torch.stack(tokens[:k], 1), torch.stack(probs[:k], 1), lens, passes, first_logits, withheld, point_mass)
    return Drafts(torch.zeros(len(seqs), 0, dtype=torch.int64), None, lens, passes, first_logits, withheld)


def looked_up_drafts(planned: Tensor, lens: list[int], passes: int, first_logits: Tensor, point_mass: Tensor,
                     eos: set[int], sampling: SamplingParams, policy: DraftPolicy | None) -> Drafts:
    """The Drafts of a round whose every row is looked up: ``planned`` [B, max(lens)] cut at each
    row's length and first EOS; ``policy`` may withhold the first token."""
    withheld = False
    if policy is not None and lens[0] and not policy.propose_first(point_mass_step(planned[:, 0]), float(sampling.temperature)):
        lens[0], withheld = 0, True
    for b, row in enumerate(planned.tolist()):
        lens[b] = next((i + 1 for i, token in enumerate(row[: lens[b]]) if token in eos), lens[b])
    return Drafts(planned[:, : max(lens, default=0)], None, lens, passes, first_logits, withheld, point_mass)


def chain_feed(seqs: list[Request], drafts: Drafts) -> Tensor:
    """[B, k + 1] int64: each row's last committed token, then its drafts (on the drafts' device)."""
    last = torch.tensor([[s.ids[-1]] for s in seqs], device=drafts.tokens.device)
    return torch.cat([last, drafts.tokens], 1)


def verify_drafts(target_logits: Tensor, drafts: Drafts, verify_uniforms: list[Tensor], sampling: SamplingParams,
                  verifier: str) -> Verified:
    """Verify ``drafts`` against the target's logits [B, k + 1, V]. verify_uniforms[b]: row b's
    lens[b] + 1 uniforms (its acceptance tests, then the emitted token's sample)."""
    device, k = target_logits.device, target_logits.shape[1] - 1
    uniforms = padded([u[:n] for u, n in zip(verify_uniforms, drafts.lens)], k + 1)
    uniforms[:, k] = torch.stack([u[n] for u, n in zip(verify_uniforms, drafts.lens)])
    q = drafts.probs.to(device) if drafts.probs is not None else None
    point_mass = drafts.point_mass.to(device) if q is not None and drafts.point_mass is not None else None
    out = verify(target_logits, q, drafts.tokens.to(device), torch.tensor(drafts.lens, device=device),
                 point_mass=point_mass, sampling=sampling, uniforms=uniforms.to(device), verifier=verifier)
    # The round's one host sync: the loop needs the emitted tokens to go on.
    return Verified(target_logits, q, out, out.num_accepted.tolist(), out.tokens.tolist())


def roll_back(lm: BatchedCachedLM, seqs: list[Request], accepted: list[int]) -> None:
    """Keep in ``lm``'s cache only each row's committed tokens and accepted drafts (or less, if
    it holds less)."""
    lm.keep(torch.tensor([len(s.ids) + a for s, a in zip(seqs, accepted)]))


def commit(seqs: list[Request], drafts: Drafts, accepted: list[int], emitted: list[list[int]],
           eos: set[int]) -> list[list[int]]:
    """Append each row's emitted tokens (up to EOS) and count the round. Returns the tokens each
    row committed."""
    committed = []
    for s, n, a, tokens in zip(seqs, drafts.lens, accepted, emitted):
        tokens = until_eos(tokens, eos)
        s.ids += tokens
        s.stats.record_round(n, a, len(tokens))
        s.stats.draft_calls += drafts.passes
        s.stats.withheld += drafts.withheld
        committed.append(tokens)
    return committed


def round_uniforms(seqs: list[Request], lens: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Each row's uniforms for a round drafting up to lens[b] tokens, from its own generator: the
    draft's lens[b], then the verifier's lens[b] + 1."""
    u_draft = [draw_uniforms(1, n, s.generator)[0] for s, n in zip(seqs, lens)]
    return u_draft, [draw_uniforms(1, n + 1, s.generator)[0] for s, n in zip(seqs, lens)]


def count_seconds(seqs: list[Request], start: float, target_start: float, verify_start: float) -> tuple[float, float]:
    """Add a round's seconds to each row's stats; returns (draft, target + verify) seconds."""
    end = time.perf_counter()
    for s in seqs:
        s.stats.draft_s += target_start - start
        s.stats.target_s += verify_start - target_start
        s.stats.verify_s += end - verify_start
    return target_start - start, end - target_start


def plain_step(target: BatchedCachedLM, seqs: list[Request], uniforms: Tensor, sampling: SamplingParams) -> Verified:
    """The target's pass over each row's last committed token and one token drawn from its logits
    with ``uniforms`` [B] (each row's first verification uniform), as the autoregressive loop draws
    it (the verifier with no drafts draws the same token from the same uniform): a round that
    drafts nothing costs an autoregressive step, no verification call."""
    feed = torch.tensor([[s.ids[-1]] for s in seqs])
    logits = target.extend(feed, torch.ones(feed.shape, dtype=torch.bool), 1)
    step = draft_step(logits[:, 0], sampling=sampling, uniforms=uniforms.to(logits.device))
    tokens = step.tokens[:, None]
    zeros = torch.zeros(len(seqs), dtype=torch.int64, device=tokens.device)
    # The round's one host sync: the loop needs the emitted tokens to go on.
    return Verified(logits, None, VerifyOutput(zeros, tokens, zeros + 1), [0] * len(seqs), tokens.tolist())


def plain_round(target: BatchedCachedLM, seqs: list[Request], sampling: SamplingParams, eos: set[int]) -> Round:
    """A round that drafts nothing (:func:`plain_step`), with each row's uniform drawn as
    :func:`speculative_round` draws it for no drafts."""
    start = time.perf_counter()
    verified = plain_step(target, seqs, torch.cat([draw_uniforms(1, 1, s.generator)[0] for s in seqs]), sampling)
    verify_start = time.perf_counter()
    drafts = Drafts(torch.zeros(len(seqs), 0, dtype=torch.int64), None, [0] * len(seqs))
    committed = commit(seqs, drafts, verified.accepted, verified.tokens, eos)
    return Round(drafts, verified, committed, *count_seconds(seqs, start, start, verify_start))


def speculative_round(target: BatchedCachedLM, draft: BatchedCachedLM | None, seqs: list[Request], k: int,
                      sampling: SamplingParams, verifier: str, eos: set[int], policy: DraftPolicy | None = None,
                      lookups: bool = True) -> Round:
    """One round for ``seqs`` (the rows both caches hold, in order), drafting up to k tokens each
    (fewer where the budget ends; ``draft=None`` or k = 0: none), and, with ``lookups``, whatever a
    hybrid's chooser looks up (at k = 0 too: the model's policy declining does not stop a lookup
    that pays). ``policy``: ask it token by token (one sequence). A round that drafts nothing is
    :func:`plain_round`, one whose drafts all stop before the first token takes :func:`plain_step`.
    Adds the round's counts and seconds to each sequence's stats."""
    lens = [min(k, s.remaining - 1) if draft is not None else 0 for s in seqs]
    lookup = getattr(draft, "lookup_tokens", 0) if lookups else 0  # a hybrid's looked-up rows may draft more than k
    if not max(lens, default=0) and not lookup:
        return plain_round(target, seqs, sampling, eos)
    start = time.perf_counter()
    u_draft, u_verify = round_uniforms(seqs, [max(n, min(lookup, s.remaining - 1)) for n, s in zip(lens, seqs)])
    drafts = draft_chain(draft, seqs, lens, u_draft, sampling, eos, policy)

    target_start = time.perf_counter()
    if not max(drafts.lens, default=0):
        verified = plain_step(target, seqs, torch.stack([u[0] for u in u_verify]), sampling)
        verify_start = time.perf_counter()  # the pass and its sample are the target's time
        if draft is not None:  # it may have been fed committed tokens only; a hybrid's chooser hears of the round
            roll_back(draft, seqs, verified.accepted)
    else:
        feed = chain_feed(seqs, drafts)
        # p_1..p_{k+1}; a row drafting n < k tokens leaves holes past its n + 1, which the lean
        # target does not compute (the verifier never reads them)
        fed = torch.arange(feed.shape[1], device=feed.device)[None] <= torch.tensor(drafts.lens, device=feed.device)[:, None]
        target_logits = target.extend(feed, fed, feed.shape[1])
        verify_start = time.perf_counter()
        verified = verify_drafts(target_logits, drafts, u_verify, sampling, verifier)
        for lm in (target, draft) if draft is not None else (target,):
            roll_back(lm, seqs, verified.accepted)
    emitted = [tokens[: a + 1] for tokens, a in zip(verified.tokens, verified.accepted)]
    committed = commit(seqs, drafts, verified.accepted, emitted, eos)
    return Round(drafts, verified, committed, *count_seconds(seqs, start, target_start, verify_start))
