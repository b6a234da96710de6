"""The benchmark engine and arithmetic: EfficiencyBenchmark, expected tokens per round, the verify bytes model."""

import statistics
import time

import pytest
import torch

from specdec_fast import fast_generate
from specdec_fast.bench.efficiency import EfficiencyBenchmark
from specdec_fast.bench.microbench import bytes_read, make_inputs
from specdec_fast.bench.policies import modelled_tps, oracle, same_drafts_summary
from specdec_fast.policies.costs import expected_tokens
from specdec_fast.policies.measure import affine_fit, pass_medians, step_costs

from helpers.models import CharTokenizer, tiny_llama


def test_expected_tokens_per_round():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(1.0, 4) == 5.0 and expected_tokens(0.0, 3) == 1.0


def test_bytes_model_counts_visited_rows():
    args = make_inputs(2, 3, 100, torch.bfloat16)
    accepted = torch.tensor([3, 1])  # row 0: all accepted (4 target rows); row 1: stop at 1 (2 rows + q row)
    assert bytes_read(args, accepted) == 6 * 100 * 2 + 1 * 100 * 4 + (3 + 2) * 4


def test_affine_fit_ignores_one_noisy_size():
    seconds = {n: 0.05 + 0.004 * n for n in range(1, 10)} | {3: 0.09}  # n = 3 measured in a noisy burst
    intercept, slope = affine_fit(seconds)
    assert intercept == pytest.approx(0.05) and slope == pytest.approx(0.004)


def test_step_costs_keep_the_one_token_pass_and_fit_the_longer_ones(tiny_pair):
    costs = step_costs(*tiny_pair, [1, 2, 3, 4], max_k=4, repeats=3)
    fit = costs["target_fit_s"]
    assert sorted(fit) == [1, 2, 3, 4, 5] and fit[1] == costs["target_step_s"]
    assert fit[4] - fit[3] == pytest.approx(fit[3] - fit[2]) == pytest.approx(fit[5] - fit[4])  # one line over n >= 2
    assert costs["c"] == pytest.approx(costs["draft_step_s"] / costs["target_step_s"])


class ClockLM:
    """A CachedLM stand-in whose pass over n tokens advances a fake clock by n x the machine's
    current slowness, which doubles after ``slow_after`` passes (this VM's steps in speed)."""

    vocab_size, max_length = 4, None

    def __init__(self, clock: list[float], slow_after: int):
        self.clock, self.slow_after, self.passes, self.cache_length = clock, slow_after, 0, 0

    def reset(self):
        self.cache_length = 0

    def extend(self, tokens, num_logits):
        self.passes += 1
        self.clock[0] += len(tokens) * (2.0 if self.passes > self.slow_after else 1.0)
        self.cache_length += len(tokens)
        return torch.zeros(num_logits, self.vocab_size)

    def crop(self, length):
        self.cache_length = length


def test_pass_medians_time_every_size_at_the_same_machine_speed(monkeypatch):
    """The machine slows down a quarter of the way through: timed in turn, the 1-, 2- and 4-token
    passes keep their ratios 1 : 2 : 4 (timed one size after another, the 1-token pass would
    have been timed fast and the others slow, 1 : 4 : 8)."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    lm = ClockLM(clock, slow_after=1 + 3 * 5)  # the prefill, then 5 of 20 rounds of 3 passes
    assert pass_medians([(lm, 1), (lm, 2), (lm, 4)], [1, 2, 3], repeats=18, warmup=2) == [2.0, 4.0, 8.0]
    assert lm.cache_length == 3


def test_modelled_tokens_per_second_and_the_oracle():
    costs = dict(draft_step_s=0.01, target_fit_s={1: 0.10, 2: 0.11, 3: 0.12})
    assert modelled_tps([0, 2], 4, costs) == pytest.approx(4 / (0.10 + 0.02 + 0.12))
    assert modelled_tps([4], 3, costs) == pytest.approx(3 / (0.04 + 0.14))  # T(5) extrapolated linearly
    assert modelled_tps([0, 2], 4, costs, withheld=1) == pytest.approx(4 / (0.01 + 0.10 + 0.02 + 0.12))  # a draft pass spent
    # rounds (drafted, accepted): the oracle drafts exactly the accepted tokens and emits the same ones
    out = oracle([(2, 0), (2, 2)], 4, costs)
    assert out["tps"] is None and out["modelled_tps"] == pytest.approx(4 / (0.10 + 0.02 + 0.12))
    assert out["calls_per_token"] == 0.5 and out["accepted_length"] == 2.0 and out["no_draft"] == 0.5


def test_block_vs_token_on_the_same_drafts_pools_rounds_over_prompts():
    """Accepted drafts per round over all rounds (a prompt with more rounds weighs more), not a mean of per-prompt ratios."""
    rows = [dict(rounds=2, token=1.0, block=1.5), dict(rounds=6, token=3.0, block=3.0)]
    out = same_drafts_summary(rows, 1.0, 4)
    assert (out["rounds"], out["token"], out["block"]) == (8, 0.5, 0.5625)
    assert out["gain"] == pytest.approx(1.125)  # the per-prompt ratios 1.5 and 1.0 would average 1.25


def test_efficiency_benchmark_runs_side_by_side_and_compares():
    target, draft = tiny_llama(10, vocab=16), tiny_llama(11, vocab=16, layers=1)
    prompts = [dict(kind="prose", prompt=p) for p in ("ab", "hello", "xyz!")]
    bench = EfficiencyBenchmark(target, draft, CharTokenizer(), prompts, max_new_tokens=6, temperatures=(0.0, 1.0))
    seen = []

    def speculative(ids, settings):
        seen.append((tuple(ids), settings["temperature"], settings["seed"]))
        s = fast_generate(target, draft, ids, num_draft_tokens=2, **settings).stats
        assert s.new_tokens == 6
        return dict(tps=3.0 * len(ids), acceptance=s.acceptance_rate)

    calls = []

    def drifting(ids, settings):  # the machine's speed changes run by run: only paired ratios are exact
        calls.append(None)
        return dict(tps=float(len(ids)) * (1 + len(calls)), acceptance=0.0)

    methods = {"base": drifting, "spec": speculative, "other": drifting}
    runs = bench.run(methods, "base")
    assert len(runs) == 3 * 2 * 4 and seen[0] == ((ord("a") % 16, ord("b") % 16), 0.0, 0)
    assert [r["method"] for r in runs[:4]] == ["base", "spec", "base", "other"] and runs[1]["pair"] == runs[0]["pair"] != runs[2]["pair"]
    summary = EfficiencyBenchmark.compare_with_baseline(runs, "base")
    assert [(s["temperature"], s["method"]) for s in summary] == [
        (0.0, "base"), (0.0, "spec"), (0.0, "other"), (1.0, "base"), (1.0, "spec"), (1.0, "other")]
    for s, first in ((summary[1], 0), (summary[2], 2)):  # each ratio is to its own baseline run, just before it
        pairs = zip(runs[first::4], runs[first + 1 :: 4])
        assert s["speedup"] == pytest.approx(statistics.median(r["tps"] / b["tps"] for b, r in pairs if r["temperature"] == 0))
    spec = summary[1]
    assert spec["tps"] == pytest.approx(3.0 * 4)  # median of 6, 15, 12
    assert spec["acceptance"] == statistics.median(r["acceptance"] for r in runs if r["method"] == "spec" and r["temperature"] == 0)


def test_modelled_speedups_pair_like_measured_ones_and_skip_methods_without_a_measurement():
    runs = [dict(pair="0/x", temperature=0.0, method="base", verifier="-", tps=10.0, modelled_tps=20.0),
            dict(pair="0/x", temperature=0.0, method="x", verifier="token", tps=12.0, modelled_tps=30.0),
            dict(pair="0/x", temperature=0.0, method="oracle", verifier="token", tps=None, modelled_tps=50.0)]
    base, x, oracle_row = EfficiencyBenchmark.compare_with_baseline(runs, "base")
    assert base["speedup"] == base["modelled_speedup"] == 1.0
    assert x["speedup"] == pytest.approx(1.2) and x["modelled_speedup"] == pytest.approx(1.5)
    assert "speedup" not in oracle_row and "tps" not in oracle_row and oracle_row["modelled_speedup"] == pytest.approx(2.5)


def test_best_fixed_length_is_chosen_by_modelled_tokens_per_second():
    from specdec_fast.bench.policies import summarize

    def paired(method, verifier, tps, modelled):  # a run of the target alone, then one of the method
        labels = dict(pair=f"0/{method} | {verifier}", temperature=0.0)
        return [dict(labels, method="target alone", verifier="-", tps=10.0, modelled_tps=10.0),
                dict(labels, method=method, verifier=verifier, tps=tps, modelled_tps=modelled)]

    runs = []
    for verifier in ("token", "block"):
        runs += paired("fixed k=1", verifier, 13.0, 11.0) + paired("fixed k=2", verifier, 12.0, 12.0)
    best = [s for s in summarize(runs) if s["method"].startswith("best fixed")]
    assert [s["method"] for s in best] == ["best fixed (fixed k=2)"] * 2
    assert best[0]["modelled_speedup"] == pytest.approx(1.2) and best[0]["speedup"] == pytest.approx(1.2)


def test_batch_crossover_is_the_smallest_batch_where_speculation_loses():
    from specdec_fast.bench.batch import crossover

    def result(batch, best_fixed):
        return dict(batch=batch, summary=[dict(temperature=0.0, method="autoregressive", speedup=1.0),
                                          dict(temperature=0.0, method="k=1", speedup=best_fixed),
                                          dict(temperature=0.0, method="cost-aware", speedup=2.0)])

    results = [result(1, 1.2), result(4, 0.9), result(8, 1.01), result(16, 0.7)]
    assert crossover(results, [0.0]) == {"0.0": 4}
    assert crossover(results[:1], [0.0]) == {"0.0": None}


def test_draft_bench_step_one_agreement_is_the_loops_first_draft():
    """agreement's top-1 at step 1 counts, over answer positions, the draft's first-draft argmax as
    the loop's bound pair computes it from the target's true features, against the target's argmax;
    its top-8 over an 8-token subset counts the positions whose target argmax is in the subset."""
    from specdec_fast.bench.drafts import agreement, greedy_answers
    from specdec_fast.drafts.feature import FeatureDraft
    from specdec_fast.drafts.feature_lm import feature_pair

    target = tiny_llama(7, vocab=16, layers=3)
    torch.manual_seed(3)  # an untrained draft (fc near the identity) that agrees at some positions
    draft = FeatureDraft(target, torch.tensor([0, 2, 3, 5, 7, 8, 11, 13]), source_layer=1).eval()
    answers = greedy_answers(target, [[3, 1, 4, 1], [5, 9, 2]], max_new_tokens=12)
    assert [len(ids) - start for start, ids in answers] == [12, 12]
    hits = in_subset = total = 0
    with torch.no_grad():
        for start, ids in answers:
            t, d = feature_pair(target, draft)
            want = t.extend(ids, len(ids)).argmax(-1)
            got = d.extend(ids, len(ids)).argmax(-1)
            hits += int((got == want)[start:-1].sum())
            in_subset += int(torch.isin(want, draft.lm.lm_head.vocab_ids)[start:-1].sum())
            total += len(ids) - 1 - start
    result = agreement(target, draft, answers, steps=2, tops=(1, 8))
    assert len(result[1]) == 2 and 0 < hits < in_subset < total
    assert result[1][0] == pytest.approx(hits / total)
    assert result[8] == [pytest.approx(in_subset / total)] * 2
