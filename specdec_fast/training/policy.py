"""``specdec-fast train-policy``: traces of the default pair, the acceptance predictor, and
the seed's value / policy networks by fitted value iteration.

1. Traces: fast_generate on the policy prompts (``data.prompts.policy_prompts``: neither the
   draft's training prompts, on which the draft accepts far more often than on new text,
   nor the held-out ones) with a policy
   that always drafts ``max_draft`` tokens, at each temperature; for every drafted token its
   MDPState features and the soft labels min(1, p/q) and min(R, p/q) / R, p the target's
   warped probability of the token (the exact acceptance probability, lower variance than
   the accept/reject outcome), and the same labels of the round's next drafted token.
2. The AcceptancePredictor, fitted to the soft labels (binary cross-entropy), calibrated on
   every fifth prompt, not fitted on (predicted vs observed acceptance by decile, of the
   token and of the next one).
3. ValueNetwork: the value of CONTINUING from a state, y_i = S_i a_{i+1} - lambda dt_i +
   max(0, V(state_{i+1})) (no last term after a round's last decision: the traces draft no
   further), S_i the product of the labels so far, iterated (fitted value
   iteration) with lambda the throughput its own stopping rule reaches on the traces;
   PolicyNetwork: CONTINUE iff y_i > 0, by classification.
4. Measured costs (a draft step; target passes over 1..max_draft+1 tokens: one token as
   measured, longer passes through a robust affine fit) as the priors of the CostModel. Everything is written to one safetensors file.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.prompts import policy_prompts
from ..decoding.requests import chat_prompt_ids
from ..decoding.speculative import fast_generate
from ..drafts.shipped import load_pair
from ..kernels import warp_logits
from ..policies.learned import PREDICTOR_OUTPUTS, RATIO_CAP, AcceptancePredictor, PolicyNetwork, ValueNetwork
from ..policies.mdp import FEATURES, MDPState, SpeculativePolicy
from ..policies.measure import step_costs
from ..policies.shipped import save_policy


class TraceRecorder(SpeculativePolicy):
    """Always drafts ``max_draft`` tokens; records each drafted token's features, and (through
    ``on_round``) its soft labels from the target's distribution."""

    def __init__(self, max_draft: int, temperature: float):
        super().__init__(max_draft)
        self.temperature = temperature
        self.features, self.round = [], []
        self.labels = {name: [] for name in PREDICTOR_OUTPUTS}
        self.rounds, self.round_states = 0, []

    def decide(self, state: MDPState) -> bool:
        self.round_states.append(state)
        return True

    def on_round(self, target_logits, draft_probs, draft_tokens, out) -> None:
        k = len(draft_tokens)
        if k:
            n = torch.Size([k])
            p = warp_logits(target_logits[:k], torch.full(n, self.temperature), torch.zeros(n, dtype=torch.int64),
                            torch.ones(n))
            p_x = p.gather(-1, draft_tokens[:, None]).squeeze(-1).double()
            q_x = draft_probs.gather(-1, draft_tokens[:, None]).squeeze(-1).double().clamp_min(1e-30)
            ratio = (p_x / q_x).tolist()
            # The last drafted token is followed by no decision: no state was recorded for it, and
            # each recorded token has a next one.
            for i, state in enumerate(self.round_states[:k]):
                self.features.append(state.features())
                for name, r in (("accept", ratio[i]), ("next_accept", ratio[i + 1])):
                    self.labels[name].append(min(1.0, r))
                for name, r in (("ratio", ratio[i]), ("next_ratio", ratio[i + 1])):
                    self.labels[name].append(min(RATIO_CAP, r) / RATIO_CAP)
                self.round.append(self.rounds)
        self.rounds += 1
        self.round_states = []


def collect_traces(target, draft, tokenizer, prompts: list[str], temperatures: list[float], max_new_tokens: int,
                   max_draft: int) -> dict:
    """Features [N, F], soft labels [N] of each of PREDICTOR_OUTPUTS, and for each row its round and prompt ids."""
    rows = dict(features=[], round=[], prompt=[]) | {name: [] for name in PREDICTOR_OUTPUTS}
    rounds = 0
    for i, prompt in enumerate(tqdm(prompts, desc="traces")):
        ids = chat_prompt_ids(tokenizer, prompt, chat=True)
        for temperature in temperatures:
            recorder = TraceRecorder(max_draft, temperature)
            fast_generate(target, draft, ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=i,
                          policy=recorder, eos_token_id=(), on_round=recorder.on_round, guard=False)
            rows["features"] += recorder.features
            for name in PREDICTOR_OUTPUTS:
                rows[name] += recorder.labels[name]
            rows["round"] += [rounds + r for r in recorder.round]
            rows["prompt"] += [i] * len(recorder.round)
            rounds += recorder.rounds
    return dict(features=torch.stack(rows.pop("features"))) | {name: torch.tensor(v) for name, v in rows.items()}


def _standardise(net, features: torch.Tensor) -> None:
    """The net's input statistics; a feature constant in the traces gets std = inf, so the net ignores it
    rather than extrapolating: "survival" is 1 in every trace (the recorder predicts nothing), while
    the cost-aware policy's own survival falls below 1 during a round."""
    std = features.std(0)
    net.mean.copy_(features.mean(0))
    net.std.copy_(torch.where(std > 1e-6, std, torch.inf))


def _fit(net, features: torch.Tensor, loss_fn, steps: int = 1500, lr: float = 3e-3) -> None:
    """Full-batch Adam on loss_fn(net.logits(features))."""
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        loss_fn(net.logits(features)).backward()
        optimiser.step()


def fit_predictor(traces: dict, train: torch.Tensor, hidden: int) -> AcceptancePredictor:
    predictor = AcceptancePredictor(hidden)
    x = traces["features"][train]
    _standardise(predictor, x)
    labels = torch.stack([traces[name] for name in PREDICTOR_OUTPUTS], 1)[train]
    _fit(predictor, x, lambda logits: torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))
    return predictor.eval()


def calibration(predictor: AcceptancePredictor, traces: dict, rows: torch.Tensor, output: str = "accept") -> list[dict]:
    """Predicted vs observed (soft-label) ``output`` (one of PREDICTOR_OUTPUTS) by decile of the
    prediction, on ``rows``."""
    with torch.no_grad():
        predicted = predictor(traces["features"][rows])[:, PREDICTOR_OUTPUTS.index(output)]
    observed = traces[output][rows]
    order = predicted.argsort()
    return [dict(decile=d + 1, predicted=float(predicted[chunk].mean()), observed=float(observed[chunk].mean()),
                 n=len(chunk)) for d, chunk in enumerate(order.tensor_split(10))]


def _next_in_round(traces: dict) -> torch.Tensor:
    """Index of the next drafted token of the same round, -1 for a round's last one."""
    same = traces["round"][1:] == traces["round"][:-1]
    return torch.cat([torch.where(same, torch.arange(1, len(same) + 1), -1), torch.tensor([-1])])


def fit_value_networks(traces: dict, train: torch.Tensor, costs: dict, hidden: int, iterations: int = 4):
    """Fitted value iteration for the value of CONTINUING; the policy network imitates its decisions."""
    nxt = _next_in_round(traces)
    survival = torch.ones(len(nxt))  # S_i: the product of the labels up to i in its round
    for i in range(len(nxt)):
        prev = i - 1
        survival[i] = traces["accept"][i] * (survival[prev] if prev >= 0 and nxt[prev] == i else 1.0)
    position = traces["features"][:, FEATURES.index("position")].long()
    step = costs["draft_step_s"] + torch.tensor([costs["target_pass_s"][int(p) + 2] - costs["target_pass_s"][int(p) + 1]
                                                 for p in position])
    value = ValueNetwork(hidden)
    _standardise(value, traces["features"][train])
    throughput = 1.0 / costs["target_pass_s"][1]
    for _ in range(iterations):
        with torch.no_grad():  # a round's last decision drafts its last token: nothing follows it
            continuation = torch.where(nxt >= 0, value(traces["features"]).clamp_min(0.0)[nxt.clamp_min(0)], 0.0)
        gain = survival * traces["next_accept"] - throughput * step + continuation
        target = gain[train]
        _fit(value, traces["features"][train], lambda v: torch.nn.functional.mse_loss(v[:, 0], target), steps=600)
        throughput = trace_throughput(traces, train, value, costs)
    policy = PolicyNetwork(hidden)
    _standardise(policy, traces["features"][train])
    decisions = (gain[train] > 0).float()
    _fit(policy, traces["features"][train],
         lambda logit: torch.nn.functional.binary_cross_entropy_with_logits(logit[:, 0], decisions), steps=600)
    return value.eval(), policy.eval(), throughput


def trace_throughput(traces: dict, rows: torch.Tensor, network, costs: dict) -> float:
    """Tokens per second the rule 'CONTINUE iff network(features) > 0' would reach on these rounds
    (expected tokens 1 + sum of survivals up to the stop, time c d + T(d + 1), d tokens drafted)."""
    with torch.no_grad():
        go = network(traces["features"]) > 0
    tokens = seconds = 0.0
    for r in traces["round"][rows].unique().tolist():
        idx = (traces["round"] == r).nonzero().flatten()
        drafted, survival, expected = 0, 1.0, 1.0
        for i in idx.tolist():
            drafted += 1
            survival *= float(traces["accept"][i])
            expected += survival
            if not go[i]:
                break
        else:  # CONTINUE at the round's last decision drafts the token after it
            drafted += 1
            expected += survival * float(traces["next_accept"][idx[-1]])
        tokens += expected
        seconds += drafted * costs["draft_step_s"] + costs["target_pass_s"][drafted + 1]
    return tokens / seconds


def run(out: Path, prompts: int, temperatures: list[float], max_new_tokens: int, max_draft: int, hidden: int = 32,
        draft_kind: str = "feature") -> dict:
    target, draft, tokenizer = load_pair(draft_kind)
    if not 5 <= prompts <= len(policy_prompts()):
        raise ValueError(f"prompts must be in 5..{len(policy_prompts())} (the policy prompts), got {prompts}")
    chosen = policy_prompts()[:prompts]
    start = time.perf_counter()
    traces = collect_traces(target, draft, tokenizer, chosen, temperatures, max_new_tokens, max_draft)
    measured = step_costs(target, draft, chat_prompt_ids(tokenizer, chosen[0], chat=True), max_draft + 1)
    costs = dict(draft_step_s=measured["draft_step_s"], target_pass_s=measured["target_fit_s"])
    train = traces["prompt"] % 5 != 4
    torch.manual_seed(0)  # the networks' initial weights: the same traces give the same artifact
    predictor = fit_predictor(traces, train, hidden)
    value, policy, throughput = fit_value_networks(traces, train, costs, hidden)
    metadata = dict(hidden=hidden, features=list(FEATURES), outputs=list(PREDICTOR_OUTPUTS), draft_step_s=costs["draft_step_s"],
                    target_pass_s={str(n): s for n, s in costs["target_pass_s"].items()}, ratio_cap=RATIO_CAP,
                    max_draft=max_draft, draft=draft_kind, temperatures=temperatures, prompts=len(chosen), rows=len(traces["accept"]),
                    calibration=calibration(predictor, traces, ~train),
                    next_calibration=calibration(predictor, traces, ~train, "next_accept"), value_throughput=throughput,
                    minutes=(time.perf_counter() - start) / 60)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_policy(out, predictor, value, policy, metadata)
    return metadata
