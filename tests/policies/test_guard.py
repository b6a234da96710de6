"""The guard (policies/guard.py) and the calibration it reads (policies/calibration.py,
decoding/calibrate.py): drafting stops where it loses and comes back where it pays, probes thin out,
the calibration is stored under a key that names the machine and the path, and the loops keep the
target's law with the guard on."""

from __future__ import annotations

import json

import pytest
import torch

from specdec_fast import fast_generate, generate_autoregressive
from specdec_fast.decoding.calibrate import calibrate, calibration_for, key_for
from specdec_fast.decoding.round import Drafts
from specdec_fast.drafts import Hybrid, PromptLookup
from specdec_fast.policies.baselines import FixedDraftLength
from specdec_fast.policies.calibration import Calibration, calibration_path, load_calibration, model_identity
from specdec_fast.policies.costs import CostModel
from specdec_fast.policies.guard import SpeculationGuard
from specdec_fast.policies.learned import AcceptancePredictor, CostAwarePolicy

from helpers.distribution import chi_square, sequence_counts
from helpers.markov import bigram_joint, bigram_pair
from helpers.models import NO_EOS, PROMPT, tiny_llama


def made_up(plain: float = 1.0, passes: dict | None = None, step: float = 0.1, fixed: float = 0.05) -> Calibration:
    """A calibration with the given costs (seconds), as if measured."""
    passes = passes or {1: 0.9, 2: 1.0, 3: 1.1, 5: 1.3, 9: 1.7}
    return Calibration({"made": "up"}, {32: passes}, plain, step, fixed, 100.0, 20.0, 0.5)


def run(guard: SpeculationGuard, rounds: int, emitted_if_drafting: int, drafting_seconds: float, k: int = 4,
        accepted_if_drafting: int = 0) -> list[int]:
    """Drive ``guard`` for ``rounds`` rounds of a policy asking for k; returns the lengths it allowed."""
    allowed = []
    for _ in range(rounds):
        n = guard.allow(k)
        allowed.append(n)
        if n:
            guard.observe(True, n, min(n, accepted_if_drafting), emitted_if_drafting, drafting_seconds)
        else:
            guard.observe(False, 0, 0, 1, 1.0)
    return allowed


def test_drafting_that_loses_stops_after_a_cheap_probe_and_probes_thin_out():
    guard = SpeculationGuard(made_up(), probe_every=4, max_gap=16, probe_budget=1.0)
    allowed = run(guard, 80, emitted_if_drafting=1, drafting_seconds=1.3)  # a round of 1 token in 1.3 plain rounds
    probes = [i for i, n in enumerate(allowed) if n]
    assert allowed[0] == 1 and all(allowed[i] == 1 for i in probes)  # every drafting round is a one-token probe
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[0] == 4 and gaps[-1] == 16  # doubling, capped


def test_probes_that_lose_more_wait_longer():
    """A probe that lost 0.3 tokens (1 token in 1.3 plain rounds) at a budget of 1% of the time:
    the next one comes after at least 30 plain rounds, not probe_every."""
    guard = SpeculationGuard(made_up(), probe_every=4, max_gap=256, probe_budget=0.01)
    allowed = run(guard, 100, emitted_if_drafting=1, drafting_seconds=1.3)
    probes = [i for i, n in enumerate(allowed) if n]
    assert probes[0] == 0 and 30 <= probes[1] - probes[0] - 1 <= 31


def test_a_probe_stays_pending_while_a_lookup_finds_nothing():
    """Rounds that spent nothing on drafting (the lookup found nothing) are plain rounds: the probe
    is asked again each round until the lookup proposes, and then judged."""
    guard = SpeculationGuard(made_up(), probe_every=4)
    assert guard.allow(4) == 1  # the loop's first drafting round is a probe
    for _ in range(3):
        guard.observe(False, 0, 0, 1, 1.0)  # nothing found: no draft
        assert guard.allow(4) == 1
    guard.observe(True, 1, 1, 2, 1.1)  # it proposed and paid
    assert guard.allow(4) == 2


def test_drafts_spend_when_they_draft_or_withhold_not_when_a_lookup_finds_nothing():
    empty = torch.zeros(1, 0, dtype=torch.int64)
    assert not Drafts(empty, None, [0], passes=1).spent  # a lookup's round with no match
    assert Drafts(empty, None, [0], passes=1, withheld=True).spent  # a draft pass, its token withheld
    assert Drafts(torch.zeros(2, 1, dtype=torch.int64), None, [0, 1], passes=1).spent


def test_drafting_that_pays_keeps_the_policys_length():
    guard = SpeculationGuard(made_up(), probe_every=4)
    allowed = run(guard, 40, emitted_if_drafting=4, drafting_seconds=1.5, accepted_if_drafting=3)
    assert allowed[0] == 1 and allowed[1:] == [2] + [4] * 38  # the probe, then doubling up to the policy's length


def test_drafting_that_starts_to_lose_stops_once_its_running_value_is_negative():
    guard = SpeculationGuard(made_up(), probe_every=4, patience=2, smoothing=0.7)
    run(guard, 5, emitted_if_drafting=4, drafting_seconds=1.5, accepted_if_drafting=3)  # worth 2.5 tokens a round
    assert guard.drafting
    allowed = run(guard, 6, emitted_if_drafting=1, drafting_seconds=2.0)  # then -1: the running value 2.5 0.7^n - (1 - 0.7^n)
    assert allowed == [4, 4, 4, 4, 0, 0]


def test_lucky_probes_followed_by_losing_rounds_thin_out_too():
    """Probes that pay (their one token accepted, cheaply) bring drafting back, and the rounds
    after them lose more than the probe gained: each such period doubles the gap, as a failed
    probe does, instead of probing again after probe_every."""
    guard = SpeculationGuard(made_up(), probe_every=4, max_gap=32, probe_budget=1.0)
    starts = []
    for i in range(200):
        n = guard.allow(4)
        if n == 1:
            starts.append(i)
            guard.observe(True, 1, 1, 2, 1.0)  # worth 1 token
        elif n:
            guard.observe(True, n, 0, 1, 3.0)  # worth -2 tokens
        else:
            guard.observe(False, 0, 0, 1, 1.0)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) >= 4 and gaps[0] < gaps[1] < gaps[2] and min(gaps[3:]) > 4 * gaps[0]


def test_a_probe_that_pays_does_not_resume_where_the_asked_rounds_would_not():
    """A one-token probe that pays (cheap), at an acceptance at which longer rounds lose by the
    calibrated costs (a pass over 2 tokens costs 3 plain rounds): drafting stays off."""
    expensive = made_up(passes={1: 0.9, 2: 3.0, 9: 9.0})
    guard = SpeculationGuard(expensive, probe_every=4)
    assert run(guard, 1, emitted_if_drafting=2, drafting_seconds=1.0, k=4) == [1]
    assert not guard.drafting


def test_without_a_calibration_a_plain_round_is_timed_first():
    guard = SpeculationGuard(None, probe_every=4)
    assert guard.allow(4) == 0
    guard.observe(False, 0, 0, 1, 1.0)
    assert guard.allow(4) == 1


def test_a_batch_is_weighed_against_a_plain_round_of_as_many_rows():
    guard = SpeculationGuard(made_up(), probe_every=4)
    assert guard.plain(4) == pytest.approx(1.0 * 1.2 / 0.9)  # the calibrated pass over 4 tokens (between 3 and 5), as a plain round's share
    guard.observe(False, 0, 0, 4, 2.0, rows=4)
    assert guard.plain(4) == 2.0


def test_calibration_measures_the_path_and_is_stored_under_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_FAST_CACHE", str(tmp_path))
    target, draft = tiny_llama(30, vocab=32), tiny_llama(31, vocab=32, layers=1)
    measured = calibration_for(target, draft, max_draft_tokens=3)
    assert measured.key == key_for(target, draft) and measured.extra["max_draft_tokens"] == 3
    sizes = measured.target_pass_s[min(measured.target_pass_s)]
    assert sorted(sizes) == [1, 2, 3, 4, 5] and len(measured.target_pass_s) == 2 and all(t > 0 for t in sizes.values())
    assert measured.plain_round_s > 0 and measured.draft_step_s > 0 and measured.matmul_gflops > 0 and measured.read_gbps > 0
    stored = load_calibration(measured.key)
    assert stored == measured and calibration_path(measured.key).parent == tmp_path / "calibration"
    # another draft, precision or thread count is another key; a damaged file is measured again
    assert key_for(target, PromptLookup()) != measured.key and key_for(target, draft, "fp32-dense") != measured.key
    assert measured.key["threads"] == torch.get_num_threads() and measured.key["build"]["isa"]
    calibration_path(measured.key).write_text("{not json")
    assert load_calibration(measured.key) is None


def test_a_models_identity_is_kept_until_its_layout_changes():
    """Another checkpoint of the same architecture is another model; the same object keeps its
    identity (read once) until its dtype changes."""
    model, other = tiny_llama(30, vocab=32), tiny_llama(31, vocab=32)
    first = model_identity(model)
    assert model_identity(model) == first and model_identity(other) != first
    model.to(torch.float64)
    assert model_identity(model) != first
    model.to(torch.float32)
    assert model_identity(model) == first


def test_calibration_round_trips_through_json():
    c = made_up()
    assert Calibration.from_json(c.to_json()) == c
    assert json.loads(c.to_json())["plain_round_s"] == 1.0
    assert c.round_s(0) == 1.0 and c.round_s(4) == pytest.approx(1.3 + 4 * 0.1 + 0.05)
    assert c.rate(1.0, 4) == pytest.approx(5 / c.round_s(4))


def test_the_cost_aware_policy_starts_from_the_calibration_unless_its_costs_are_its_own():
    prior = CostModel(1e-4, {1: 1e-3, 2: 1.1e-3})
    shipped_like = CostAwarePolicy(AcceptancePredictor(), prior)
    own = CostAwarePolicy(AcceptancePredictor(), prior, calibrate=False)
    for policy in (shipped_like, own):
        policy.use_calibration(made_up())
    assert shipped_like.costs.target(1) == pytest.approx(1.0) and shipped_like.costs.target(9) == pytest.approx(1.75)
    assert own.costs is prior


def test_calibrate_takes_a_lookup_and_a_hybrid(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_FAST_CACHE", str(tmp_path))
    target = tiny_llama(32, vocab=32)
    for draft in (PromptLookup(max_tokens=3), Hybrid(tiny_llama(33, vocab=32, layers=1), PromptLookup(max_tokens=3))):
        c = calibrate(target, draft, max_draft_tokens=3, repeats=1)
        assert c.plain_round_s > 0 and c.draft_step_s > 0


def test_a_loop_that_never_drafts_is_the_autoregressive_loop():
    """Plain rounds draw each token as the autoregressive loop does, from the same uniform: the same
    tokens for the same seed at T = 1 with top-k and top-p."""
    target, draft = tiny_llama(34, vocab=64), tiny_llama(35, vocab=64, layers=1)
    settings = dict(max_new_tokens=40, temperature=1.0, top_k=20, top_p=0.9, seed=3, eos_token_id=NO_EOS)
    plain = fast_generate(target, draft, [1, 2, 3], policy=FixedDraftLength(0), **settings)
    assert plain.tokens == generate_autoregressive(target, [1, 2, 3], **settings).tokens
    assert plain.stats.drafted == 0 and plain.stats.draft_calls == 1  # the draft's prompt only


class RestlessGuard(SpeculationGuard):
    """The guard with its choices forced to vary: a probe after every plain round, drafting off after
    any losing round, and the plain round's seconds it weighs against scaled by a random factor (a
    clock that jumps), so that it stops and resumes drafting often."""

    def __init__(self, calibration=None):
        super().__init__(calibration, probe_every=1, max_gap=1, patience=1, smoothing=0.0)
        self.jumps = torch.Generator().manual_seed(len(RESTLESS))
        RESTLESS.append(self)

    def plain(self, rows: int) -> float | None:
        measured = super().plain(rows)
        return None if measured is None else measured * float(torch.empty(1).uniform_(0.2, 5.0, generator=self.jumps))

    def pays(self, k: int, rows: int) -> bool:
        return True


RESTLESS: list[RestlessGuard] = []


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.8, 5, 0.9)])
def test_the_guard_keeps_the_exact_joint(monkeypatch, temperature, top_k, top_p):
    """Chi-square of the first 3 tokens (512 cells) against their exact joint over 6,000 seeds, the
    guard on and restless (rounds of 2 drafts, one-token probes and plain rounds mixed); the negative
    control, samples of the draft alone, is rejected by the same limit."""
    monkeypatch.setattr("specdec_fast.decoding.calibrate.SpeculationGuard", RestlessGuard)
    target, draft = bigram_pair(8, seed=0)
    seqs, lengths = [], set()
    for seed in range(6000):
        out = fast_generate(target, draft, PROMPT, max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p,
                            num_draft_tokens=2, seed=seed, eos_token_id=NO_EOS)
        seqs.append(out.tokens)
        lengths.add((out.stats.rounds, out.stats.drafted))
    joint = bigram_joint(target, PROMPT[-1], 3, temperature, top_k, top_p)
    stat, threshold, df = chi_square(sequence_counts(torch.tensor(seqs), 8), joint)
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"
    assert len(lengths) > 2, "the guard never varied the rounds: the test would not exercise it"
    wrong = [generate_autoregressive(draft, PROMPT, max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p,
                                     seed=seed, eos_token_id=NO_EOS).tokens for seed in range(6000)]
    assert chi_square(sequence_counts(torch.tensor(wrong), 8), joint)[0] > threshold
