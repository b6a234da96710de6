"""Point-mass drafts (fixed proposals, a prompt lookup's): ``verify(target, None, tokens)``.

q_i is one-hot at X_i, so X_i is accepted with probability p_i(X_i) and a rejection resamples
from p_i with X_i removed. Losslessness holds for any proposal chosen without the verifier's
uniforms; here the proposals are drawn from a related chain, then verified as point masses.
Chi-square at every position and adjacent pair, every backend, token-wise and block, with
temperature, top-k and top-p (test_verify.py's grid, draft "point mass"); mixed batches; the exact equality with a one-hot q tensor; a
negative control that must fail."""

from __future__ import annotations

import zlib

import pytest
import torch

from specdec_fast import VerifyOutput, verify
from specdec_fast.kernels import SamplingParams, warp_logits
from specdec_fast.kernels.sampling import sample_inverse_cdf

from helpers.backends import GPU, kernel_params
from helpers.markov import failing_positions, make_pair, run_trials

TRIALS = 20_000
BACKENDS = ("torch", "cpu") + (("triton", "cuda") if GPU else ())


def on(backend: str, *tensors):
    device = "cuda" if backend == "cuda" or (backend == "triton" and GPU) else "cpu"
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


def point_mass_verifier(pair, backend: str, rule: str, mixed: bool = False):
    """verify with the drafted tokens taken as point masses (draft_probs=None), or (mixed) with q
    for a random half of the rows and point masses for the other half."""
    def fn(target_logits, draft_probs, draft_tokens, draft_lens, g):
        point_mass = torch.rand(len(draft_lens), generator=g) < 0.5 if mixed else None
        q = draft_probs if mixed else None
        args = on(backend, target_logits, q, draft_tokens, draft_lens)
        out = verify(*args, point_mass=on(backend, point_mass)[0], sampling=SamplingParams(pair.temperature, pair.top_k, pair.top_p),
                     generator=g, verifier=rule, backend=backend)
        return VerifyOutput(*(t.cpu() for t in out))

    return fn


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", ["token", "block"])
def test_mixed_batches_follow_target(backend, rule):
    """Half the rows verified against their q, half as point masses, in one call."""
    pair = make_pair(3, 16, 0.8, 5, 0.9, seed=zlib.crc32(b"mixed"))
    seq = run_trials(pair, point_mass_verifier(pair, backend, rule, mixed=True), TRIALS, seed=11)
    assert failing_positions(pair, seq) == []


@pytest.mark.slow
def test_interpreted_triton_point_masses_follow_target():
    """Triton under the interpreter (no GPU): block verification of point masses (the closed
    form), plain sampling, 600 trials; every rule's tokens equal the reference's on the same
    uniforms (test_kernels_match_reference), which the full grid checks."""
    if GPU:
        pytest.skip("a GPU is present: Triton runs the full grid above")
    pair = make_pair(3, 16, 1.0, 0, 1.0, seed=zlib.crc32(b"triton point"))
    seq = run_trials(pair, point_mass_verifier(pair, "triton", "block"), 600, seed=5)
    assert failing_positions(pair, seq) == []


def resample_without_removing(pair):
    """Wrong on purpose: a rejected point mass resampled from p itself (X not removed)."""
    def fn(target_logits, draft_probs, draft_tokens, draft_lens, g):
        out = verify(target_logits, None, draft_tokens, draft_lens, sampling=SamplingParams(pair.temperature), generator=g)
        rows = torch.arange(len(draft_lens))
        p_stop = pair.warp(target_logits[rows, out.num_accepted])
        y = sample_inverse_cdf(p_stop, 1 - torch.rand(len(draft_lens), generator=g))
        tokens = out.tokens.clone()
        rejected = out.num_accepted < draft_lens
        tokens[rows, out.num_accepted] = torch.where(rejected, y, tokens[rows, out.num_accepted])
        return VerifyOutput(out.num_accepted, tokens, out.num_emitted)

    return fn


def test_negative_control_detects_unremoved_proposal():
    pair = make_pair(3, 16, 1.0, 0, 1.0, seed=7)
    seq = run_trials(pair, resample_without_removing(pair), TRIALS, seed=8)
    assert failing_positions(pair, seq) != []


def random_case(seed: int, batch: int = 6, k: int = 4, vocab: int = 300):
    g = torch.Generator().manual_seed(seed)
    target = 2 * torch.randn(batch, k + 1, vocab, generator=g)
    q = torch.softmax(target[:, :k] + torch.randn(batch, k, vocab, generator=g), -1)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    x[:, 0] = target[:, 0].argmax(-1)  # a likely first token: some rows accept several
    lens = torch.randint(0, k + 1, (batch,), generator=g)
    u = 1 - torch.rand(batch, k + 1, generator=g)
    return target, q, x, lens, u


SETTINGS = [SamplingParams(1.0), SamplingParams(0.7, top_k=20, top_p=0.9), SamplingParams(0.0),
            SamplingParams([1.0, 0.0, 0.5, 1.2, 0.8, 1.0], top_k=[0, 0, 5, 0, 50, 2], top_p=[1.0, 1.0, 0.9, 0.5, 1.0, 1.0])]


@pytest.mark.parametrize("backend,device", kernel_params())
@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_kernels_match_reference(backend, device, rule, setting):
    """Every backend emits the reference's tokens on the same uniforms: all rows point masses,
    and mixed batches."""
    for seed in range(3 if GPU or backend != "triton" else 1):  # the interpreter takes seconds per call
        target, q, x, lens, u = random_case(seed)
        mixed = torch.tensor([True, False, True, True, False, False])
        for draft_probs, point_mass in ((None, None), (q, mixed)):
            kwargs = dict(sampling=SETTINGS[setting], uniforms=u, verifier=rule)
            ref = verify(target, draft_probs, x, lens, point_mass=point_mass, backend="torch", **kwargs)
            moved = [t.to(device) if t is not None else None for t in (target, draft_probs, x, lens, point_mass)]
            out = verify(*moved[:4], point_mass=moved[4], backend=backend, **(kwargs | dict(uniforms=u.to(device))))
            for got, want in zip(out, ref):
                assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", ["token", "block"])
def test_a_point_mass_is_its_one_hot_q(backend, rule):
    """draft_probs=None gives what the one-hot q tensor gives (block verification's closed form
    r_i = p_i (1 - P_{i+1}(X_{i+1})) against the pass over the row), uniforms and all."""
    for seed in range(4):
        target, _, x, lens, u = random_case(seed + 10)
        one_hot = torch.nn.functional.one_hot(x, target.shape[-1]).float()
        kwargs = dict(sampling=SamplingParams(0.9, top_p=0.95), uniforms=u, verifier=rule, backend=backend)
        point = verify(*on(backend, target, None, x, lens), **(kwargs | dict(uniforms=on(backend, u)[0])))
        dense = verify(*on(backend, target, one_hot, x, lens), **(kwargs | dict(uniforms=on(backend, u)[0])))
        for a, b in zip(point, dense):
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_never_accepts_fewer_than_token_wise(backend):
    """For point masses, block verification's expected accepted count (over many uniforms) is at
    least token-wise's, whose expectation is sum_i prod_{j <= i} P_j(X_j)."""
    target, _, x, _, _ = random_case(3, batch=1, k=4, vocab=6)
    target = target / 3  # flat rows: each proposal has a fair chance
    n = 40_000
    g = torch.Generator().manual_seed(1)
    args = on(backend, target.expand(n, -1, -1), None, x.expand(n, -1))
    accepted = {rule: verify(*args, generator=g, verifier=rule, backend=backend).num_accepted.float().mean().item()
                for rule in ("token", "block")}
    p = warp_logits(target[0], torch.ones(5), torch.zeros(5, dtype=torch.int64), torch.ones(5))
    p_x = p[torch.arange(4), x[0]]
    exact_token_wise = p_x.cumprod(0).sum().item()
    assert accepted["token"] == pytest.approx(exact_token_wise, abs=0.03)
    assert accepted["block"] >= accepted["token"] - 0.02


def test_point_mass_argument_errors():
    target, q, x, lens, _ = random_case(0)
    with pytest.raises(ValueError, match="with draft_probs=None every row is a point mass"):
        verify(target, None, x, lens, point_mass=torch.ones(6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"point_mass must be a bool tensor of shape \[B\]"):
        verify(target, q, x, lens, point_mass=torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"outside \[0, V\)"):
        verify(target, None, x + 1000, lens.clamp(min=1))
