"""Draft-length policies x verifiers on the default pair (``benchmarks/policies.py``, ``specdec-fast policies``).

On held-out prompts, at each temperature, side by side per prompt, each run right after its
own run of the target alone: for the token-wise and the block verifier, fixed draft
lengths, transformers' heuristic schedule, the confidence threshold, the entropy rule (AdaEDL), the learned cost-aware
policy with two ablations (its first-draft gate off; the next token's acceptance taken to be
the current token's), and the seed's value and policy networks. Reported per method: median tokens/s
(and speedup over the target alone), target calls per new token, mean accepted length.

The oracle (evaluation only, never a user policy) knows which drafts the target accepts:
from a run that drafts the longest fixed length K token-wise, each round with a accepted
tokens would have drafted exactly those a (stopping before the first rejection) and
emitted the same a + 1. Its tokens/s is modelled: a round of d drafts costs d draft steps
plus one target pass over d + 1 tokens, at the costs measured in the run (step_costs'
target_fit_s: the one-token pass as measured, longer passes through an affine fit).
Every method's tokens/s is also reported modelled the same way from its own rounds, with
the draft passes of first drafts a policy chose not to verify ("modelled_tps"): free of the
timing noise, so policies and the oracle compare on equal terms (it leaves out the loop's
own overhead, which the measured tokens/s include), and its ratio to the target alone's
modelled one-token pass ("modelled speedup"); the oracle has no measured tokens/s. The
best fixed length is chosen in hindsight on the same prompts, by modelled tokens/s.

Block vs token-wise on the same drafts: in each fixed length's token-wise run, every round's
drafts and target logits are verified again by both rules with 64 fresh uniform draws each,
so the two expected accepted lengths (accepted drafts per round, the bonus token left out,
as in DESIGN.md's toy case: 11/9 vs 10/9) are compared on identical drafts (paired, low
variance), pooled over the prompts' rounds, per draft length.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..decoding import fast_generate, generate_autoregressive
from ..kernels import SamplingParams, verify
from ..policies.baselines import ConfidenceThreshold, EntropyStop, FixedDraftLength, HeuristicSchedule
from ..policies.costs import CostModel
from ..policies.learned import CostAwarePolicy, NetworkPolicy
from ..policies.measure import step_costs
from ..policies.shipped import POLICY_FILES, default_policy, load_policy
from .common import machine, markdown_table, write_results
from .efficiency import EfficiencyBenchmark, plot_speedups


class VerifyEveryFirstDraft(CostAwarePolicy):
    """Ablation: the learned policy without its first-draft gate."""

    def propose_first(self, step, temperature: float) -> bool:
        return True


class CurrentTokenAsNext(CostAwarePolicy):
    """Ablation: the learned policy with the next token's acceptance taken to be the current one's."""

    def predict(self, state) -> list[float]:
        accept, ratio, _, _ = super().predict(state)
        return [accept, ratio, accept, ratio]


def policy_factories(lengths: list[int], draft_kind: str) -> dict:
    """name -> (verifier -> a fresh policy); the learned ones are those shipped for ``draft_kind``."""
    _, value, policy, _ = load_policy(POLICY_FILES[draft_kind])

    def ablation(cls: type, verifier: str) -> CostAwarePolicy:
        learned = default_policy(verifier, POLICY_FILES[draft_kind])
        return cls(learned.predictor, learned.costs, verifier=verifier, max_draft_tokens=learned.max_length)

    factories = {f"fixed k={k}": (lambda v, k=k: FixedDraftLength(k)) for k in lengths}
    return factories | {
        "heuristic": lambda v: HeuristicSchedule(),
        "confidence": lambda v: ConfidenceThreshold(),
        "entropy (AdaEDL)": lambda v: EntropyStop(),
        "learned cost-aware": lambda v: default_policy(v, POLICY_FILES[draft_kind]),
        "learned, every first draft verified": lambda v: ablation(VerifyEveryFirstDraft, v),
        "learned, next acceptance := current": lambda v: ablation(CurrentTokenAsNext, v),
        "value network": lambda v: NetworkPolicy(value),
        "policy network": lambda v: NetworkPolicy(policy),
    }


def paired_accepted(target_logits, draft_probs, draft_tokens, temperature: float, draws: int = 64) -> dict:
    """Expected accepted tokens of one round's drafts under each verifier, over `draws` uniform draws."""
    batch = lambda t: t[None].expand(draws, *t.shape)  # noqa: E731
    args = (batch(target_logits), batch(draft_probs), batch(draft_tokens))
    return {rule: float(verify(*args, sampling=SamplingParams(temperature), verifier=rule, seed=torch.arange(draws), offset=0)
                        .num_accepted.double().mean()) for rule in ("token", "block")}


def modelled_tps(drafted: list[int], new_tokens: int, costs: dict, withheld: int = 0) -> float:
    """tokens/s of rounds that verified ``drafted[i]`` drafts each, plus the draft passes of
    ``withheld`` first drafts not verified, at step_costs' draft step and fitted target passes
    (linear beyond the sizes fitted, as the cost-aware policy's CostModel)."""
    model = CostModel(costs["draft_step_s"], {int(n): t for n, t in costs["target_fit_s"].items()})
    return new_tokens / (withheld * model.draft() + sum(d * model.draft() + model.target(d + 1) for d in drafted))


def oracle(rounds: list[tuple[int, int]], new_tokens: int, costs: dict) -> dict:
    """tokens/s (modelled only: tps is None), target calls per token and accepted length of drafting
    exactly the tokens each round accepts, from rounds (drafted, accepted)."""
    return dict(tps=None, modelled_tps=modelled_tps([a for _, a in rounds], new_tokens, costs),
                calls_per_token=len(rounds) / new_tokens, accepted_length=new_tokens / len(rounds),
                no_draft=sum(a == 0 for _, a in rounds) / len(rounds))


def run(num_prompts: int, temperatures: list[float], max_new_tokens: int, lengths: list[int],
        draft_kind: str = "feature", out: Path = Path("results/policies_feature")) -> dict:
    bench = EfficiencyBenchmark.default(num_prompts, draft_kind, max_new_tokens=max_new_tokens, temperatures=temperatures)
    target, draft = bench.target, bench.draft
    costs = step_costs(target, draft, bench.prompt_ids(0), max(lengths + [8]))  # the learned policies draft up to 8
    fixed = {f"fixed k={k}": k for k in lengths}
    traced_name = f"fixed k={max(lengths)}"

    def speculative(name: str, make, verifier: str):
        def method(ids, settings):
            compared = verifier == "token" and name in fixed
            rounds, kept = [], []

            def record(logits, q, x, out):
                rounds.append((len(x), int(out.num_accepted)))
                if compared and len(x):  # re-verified after the timed run
                    kept.append((logits.clone(), q.clone(), x.clone()))

            s = fast_generate(target, draft, ids, policy=make(verifier), verifier=verifier, on_round=record,
                              guard=False, **settings).stats  # each policy's own choices
            paired = [paired_accepted(*round_, settings["temperature"]) for round_ in kept]
            row = dict(method=name, verifier=verifier, tps=s.tokens_per_second,
                       modelled_tps=modelled_tps([d for d, _ in rounds], s.new_tokens, costs, s.withheld),
                       calls_per_token=s.rounds / s.new_tokens, accepted_length=s.mean_accepted_length,
                       no_draft=sum(d == 0 for d, _ in rounds) / s.rounds)
            if compared:
                row["same_drafts"] = dict(k=fixed[name], rounds=len(paired),
                                          **{rule: sum(p[rule] for p in paired) for rule in ("token", "block")})
            if compared and name == traced_name:
                row["oracle"] = oracle(rounds, s.new_tokens, costs)
            return row
        return method

    def alone(ids, settings):
        return dict(method="target alone", tps=generate_autoregressive(target, ids, **settings).stats.tokens_per_second,
                    modelled_tps=1.0 / costs["target_fit_s"][1], calls_per_token=1.0, accepted_length=1.0, no_draft=1.0)

    methods = {"target alone": alone} | {f"{name} | {verifier}": speculative(name, make, verifier)
                                         for verifier in ("token", "block")
                                         for name, make in policy_factories(lengths, draft_kind).items()}
    runs = bench.run(methods, "target alone", desc="policies")
    same_drafts = []
    for r in [r for r in runs if "same_drafts" in r]:
        labels = dict(prompt=r["prompt"], pair=r["pair"], kind=r["kind"], temperature=r["temperature"])
        if "oracle" in r:
            runs.append(dict(labels, method="oracle", verifier="token", **r.pop("oracle")))
        same_drafts.append(dict(labels, **r.pop("same_drafts")))
    summary = summarize(runs)
    paired = [same_drafts_summary([r for r in same_drafts if r["temperature"] == t and r["k"] == k], t, k)
              for t in temperatures for k in lengths]
    data = dict(machine=machine(), costs=costs, settings=dict(prompts=len(bench.prompts), max_new_tokens=max_new_tokens,
                                                              temperatures=temperatures, lengths=lengths, draft=draft_kind),
                summary=summary, same_drafts=paired, runs=runs, same_drafts_runs=same_drafts)
    write_results(out, data, table(data))
    plot_speedups(summary, out, "draft-length policies", ratio="modelled_speedup")
    return data


def same_drafts_summary(rows: list[dict], temperature: float, k: int) -> dict:
    """Mean accepted drafts per round of each rule, pooled over ``rows`` (one run each), and block / token."""
    total = {key: sum(r[key] for r in rows) for key in ("rounds", "token", "block")}
    return dict(temperature=temperature, k=k, rounds=total["rounds"], token=total["token"] / total["rounds"],
                block=total["block"] / total["rounds"], gain=total["block"] / total["token"])


def summarize(runs: list[dict]) -> list[dict]:
    """Medians over prompts per (temperature, verifier, method) (speedups: medians of per-prompt
    ratios to the target alone), plus the best fixed length in hindsight (by modelled tokens/s) per
    (temperature, verifier)."""
    summary = EfficiencyBenchmark.compare_with_baseline(runs, "target alone")
    for temperature in dict.fromkeys(s["temperature"] for s in summary):
        for verifier in ("token", "block"):
            fixed = [s for s in summary if s["temperature"] == temperature and s["verifier"] == verifier
                     and s["method"].startswith("fixed")]
            best = max(fixed, key=lambda s: s["modelled_tps"])
            summary.append(dict(best, method=f"best fixed ({best['method']})"))
    return sorted(summary, key=lambda s: s["temperature"])


def table(data: dict) -> str:
    head = ["T", "verifier", "method", "tok/s", "speedup vs target", "modelled tok/s", "modelled speedup",
            "target calls / token", "mean accepted length", "rounds verifying no draft"]
    rows = [[f"{s['temperature']:g}", s["verifier"], s["method"], s.get("tps", "-"), s.get("speedup", "-"),
             s["modelled_tps"], s["modelled_speedup"], s["calls_per_token"], s["accepted_length"], s["no_draft"]]
            for s in data["summary"]]
    c = data["costs"]
    same = markdown_table(["T", "k", "rounds", "token-wise accepted drafts / round", "block accepted drafts / round", "block / token"],
                          [[f"{p['temperature']:g}", p["k"], p["rounds"], p["token"], p["block"], p["gain"]]
                           for p in data["same_drafts"]])
    return (markdown_table(head, rows) + f"\n\nDraft: the shipped {data['settings']['draft']} draft. Costs: target pass {c['target_step_s'] * 1e3:.1f} ms, draft pass "
            f"{c['draft_step_s'] * 1e3:.1f} ms; v(k) = " + ", ".join(f"{x:.2f}" for x in c["v"].values()) + "."
            + "\n\nBlock vs token-wise verification on the same drafts (each fixed length's token-wise rounds; expected "
            "accepted drafts per round, the bonus token left out, pooled over prompts):\n\n" + same)
