"""AdaptiveMonitoringSystem: rolling metrics, the cap controller, Prometheus export, and a
real generation under it (losslessness with a moving cap is in test_policies)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec_fast import fast_generate, generate_autoregressive
from specdec_fast.policies.monitoring import AdaptiveMonitoringSystem

from helpers.models import NO_EOS, tiny_llama


def simulate(monitor: AdaptiveMonitoringSystem, rounds: int, accepted_of, draft_s: float, target_s: float) -> list[int]:
    """Run ``rounds`` rounds with deterministic acceptance and costs; return the cap of each round."""
    caps = []
    for _ in range(rounds):
        k = monitor.begin_round(10_000)
        caps.append(monitor.cap)
        monitor.observe(k, accepted_of(k), draft_s * k, target_s)
    return caps


def test_controller_finds_the_best_cap():
    """Two tokens are always accepted: throughput 3 / (0.04 + 0.01 k) peaks at k = 2."""
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=8, window=64, period=4)
    caps = simulate(monitor, 400, lambda k: min(k, 2), draft_s=0.01, target_s=0.04)
    assert set(caps[:40]) >= {8, 7, 3}, "the controller did not walk down from the start"
    assert caps[-100:].count(2) >= 0.7 * 100, caps[-100:]


def test_controller_stops_speculating_when_it_loses():
    """Nothing is ever accepted: every drafted token only costs, so the cap falls to 0 and stays mostly there."""
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=4, window=64, period=4)
    caps = simulate(monitor, 300, lambda k: 0, draft_s=0.01, target_s=0.04)
    assert caps[-100:].count(0) >= 0.8 * 100, caps[-100:]


def test_monitoring_only_keeps_the_cap():
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=3, window=8, period=2, adapt=False)
    assert set(simulate(monitor, 50, lambda k: 0, 0.01, 0.04)) == {3}


def test_rolling_metrics_and_window():
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=4, window=4, period=2, adapt=False)
    for drafted, accepted in [(4, 4), (2, 1), (2, 2), (1, 0), (0, 0)]:  # the first round leaves the window
        monitor.observe(drafted, accepted, 0.1, 0.4)
    m = monitor.metrics()
    assert m["window_rounds"] == 4
    assert m["acceptance_rate"] == pytest.approx(3 / 5)
    assert m["mean_accepted_length"] == pytest.approx(7 / 4)
    assert m["per_position_acceptance"] == pytest.approx([2 / 3, 1 / 2])
    assert m["tokens_per_second"] == pytest.approx(7 / 2.0)
    assert m["totals"]["rounds"] == 5 and m["totals"]["accepted"] == 7 and m["totals"]["drafted"] == 9


def test_prometheus_text_parses_and_matches_totals():
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=4, window=8, period=2)
    simulate(monitor, 20, lambda k: min(k, 1), 0.01, 0.04)
    samples = {(s.name, s.labels.get("position")): s.value
               for family in text_string_to_metric_families(monitor.prometheus()) for s in family.samples}
    t = monitor.totals
    assert samples[("specdec_fast:spec_decode_num_drafts_total", None)] == t.rounds == 20
    assert samples[("specdec_fast:spec_decode_num_draft_tokens_total", None)] == t.drafted
    assert samples[("specdec_fast:spec_decode_num_accepted_tokens_total", None)] == t.accepted
    assert samples[("specdec_fast:spec_decode_num_accepted_tokens_per_pos_total", "0")] == t.accepted_at[0]
    assert samples[("specdec_fast:spec_decode_max_draft_tokens", None)] == monitor.cap
    assert samples[("specdec_fast:spec_decode_acceptance_rate", None)] == pytest.approx(monitor.metrics()["acceptance_rate"])


def test_fast_generate_under_the_monitor():
    """Greedy output is the target's own; the monitor's totals are the generation's rounds."""
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    baseline = generate_autoregressive(target, [1, 2, 3], max_new_tokens=40, temperature=0.0, eos_token_id=NO_EOS)
    monitor = AdaptiveMonitoringSystem(max_draft_tokens=4, window=8, period=2)
    out = fast_generate(target, draft, [1, 2, 3], max_new_tokens=40, temperature=0.0, policy=monitor, eos_token_id=NO_EOS)
    assert out.tokens == baseline.tokens
    assert (monitor.totals.rounds, monitor.totals.drafted, monitor.totals.accepted) == (
        out.stats.rounds, out.stats.drafted, out.stats.accepted)


@pytest.mark.parametrize("kwargs", [dict(max_draft_tokens=-1), dict(period=0), dict(window=4, period=4)])
def test_bad_settings(kwargs):
    with pytest.raises(ValueError):
        AdaptiveMonitoringSystem(**kwargs)
