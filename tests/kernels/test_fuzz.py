"""Property-based fuzzing (hypothesis, derandomized) of the public verify and draft_step
APIs on every backend that runs here, against the torch reference on the same uniforms:
random shapes and ragged lengths, mixed per-row sampling settings, tied, extreme and
masked (-inf) logits, vocabularies up to 262,144. NaN logits must raise."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_fast import draft_step, verify, warp_logits
from specdec_fast.kernels import SamplingParams

from helpers.agreement import assert_same_draws
from helpers.backends import kernel_params

INTERPRETED = not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "1"
STYLES = ("normal", "flat", "peaked", "tied", "masked", "extreme")


def fuzz_settings(backend: str):
    """Fewer, smaller examples for Triton under the CPU interpreter (it runs kernels in Python)."""
    slow = backend == "triton" and INTERPRETED
    return settings(max_examples=12 if slow else 60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def logits_of(style: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    x = torch.randn(*shape, generator=g)
    if style == "flat":
        return 1e-4 * x
    if style == "peaked":
        return 40 * x
    if style == "tied":
        return torch.randint(0, 3, shape, generator=g).float()
    if style == "extreme":
        return torch.where(torch.rand(*shape, generator=g) < 0.5, -3e4, 3e4) + x
    if style == "masked":
        masked = torch.rand(*shape, generator=g) < 0.7
        masked[..., torch.randint(0, shape[-1], (), generator=g)] = False  # every row keeps a finite logit
        return x.masked_fill(masked, float("-inf"))
    return 3 * x


@st.composite
def cases(draw, max_vocab: int):
    batch = draw(st.integers(1, 4))
    k = draw(st.integers(0, 5))
    vocab = draw(st.one_of(st.integers(2, 300), st.sampled_from([v for v in (4096, 49_152, 262_144) if v <= max_vocab])))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    rows = lambda values, dt: torch.tensor(draw(st.lists(st.sampled_from(values), min_size=batch, max_size=batch)), dtype=dt)  # noqa: E731
    params = dict(sampling=SamplingParams(rows([0.0, 0.3, 1.0, 1.7], torch.float32), rows([0, 1, 2, 7], torch.int64),
                                          rows([1.0, 0.95, 0.5, 1e-3], torch.float32)))
    target = logits_of(draw(st.sampled_from(STYLES)), (batch, k + 1, vocab), g).to(dtype)
    rows_q = (batch, max(k, 1))
    q = warp_logits(logits_of(draw(st.sampled_from(STYLES)), (*rows_q, vocab), g), torch.ones(rows_q),
                    torch.full(rows_q, draw(st.sampled_from([0, 3]))), torch.ones(rows_q))[:, :k]
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k) if k else torch.zeros(batch, 0, dtype=torch.int64)
    lens = torch.randint(0, k + 1, (batch,), generator=g)
    uniforms = torch.where(torch.rand(batch, k + 1, generator=g) < 0.1, 1.0, 1 - torch.rand(batch, k + 1, generator=g))
    return dict(target=target, q=q, tokens=tokens, lens=lens, uniforms=uniforms, params=params,
                rule=draw(st.sampled_from(["token", "block"])))


def run_fuzz(backend, device, max_vocab):
    @fuzz_settings(backend)
    @given(case=cases(max_vocab))
    def check(case):
        target, q, x, lens, u, params = (case[n] for n in ("target", "q", "tokens", "lens", "uniforms", "params"))
        ref = verify(target, q, x, lens, uniforms=u, backend="torch", verifier=case["rule"], **params)
        out = verify(target.to(device), q.to(device), x.to(device), lens.to(device), uniforms=u.to(device), backend=backend,
                     verifier=case["rule"], **params)
        k1 = target.shape[1]
        warped = warp_logits(target, *(t[:, None].expand(-1, k1) for t in params["sampling"].as_tensors(len(target))))
        assert_same_draws(ref, out, warped)
        emitted = ref.tokens[ref.tokens >= 0]
        assert bool((warped.reshape(-1, warped.shape[-1])[:, emitted].amax(0) > 0).all()), "emitted a zero-probability token"

        logits = target[:, 0]
        ref_step = draft_step(logits, uniforms=u[:, 0], backend="torch", **params)
        step = draft_step(logits.to(device), uniforms=u[:, 0].to(device), backend=backend, **params)
        assert torch.equal(step.tokens.cpu(), ref_step.tokens)
        torch.testing.assert_close(step.probs.cpu(), ref_step.probs, rtol=2e-6, atol=1e-9)

    check()


@pytest.mark.parametrize("backend,device", kernel_params())
def test_fuzz_verify_and_draft_step(backend, device):
    run_fuzz(backend, device, max_vocab=4096 if backend == "triton" and INTERPRETED else 262_144)


@pytest.mark.parametrize("backend,device", [pytest.param("torch", "cpu", id="torch-cpu"), *kernel_params()])
@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(batch=st.integers(1, 3), k=st.integers(1, 3), vocab=st.integers(2, 500), where=st.integers(0, 10**9))
def test_nan_raises(backend, device, batch, k, vocab, where):
    """A NaN in a row the verifier reads is an error: anywhere in the target when every draft is
    accepted (all K + 1 rows read), at a drafted token's draft probability, anywhere in the draft
    row a rejection resamples from; and anywhere in draft_step's logits."""
    def with_nan(t: torch.Tensor, where: int = where) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[where % t.numel()] = float("nan")
        return t.to(device)

    target, logits = torch.randn(batch, k + 1, vocab), torch.randn(batch, vocab)
    q = torch.softmax(torch.randn(batch, k, vocab), -1)
    x = torch.zeros(batch, k, dtype=torch.int64, device=device)
    accept_all = torch.full((batch, k + 1), 1e-30, device=device)
    drafted_entry = (where % (batch * k)) * vocab  # q[b, i, X_i = 0]
    rejected_at_0 = target.clone()
    rejected_at_0[:, 0, 0] = float("-inf")  # p_1(X_1) = 0: row 0 is rejected and resampled from max(p - q, 0)
    row_0 = (where % batch) * k * vocab + where % vocab  # anywhere in q[b, 0]
    for args, u in (((with_nan(target), q.to(device), x), accept_all),
                    ((target.to(device), with_nan(q, drafted_entry), x), accept_all),
                    ((rejected_at_0.to(device), with_nan(q, row_0), x), torch.ones(batch, k + 1, device=device))):
        with pytest.raises(ValueError, match="NaN"):
            verify(*args, uniforms=u, backend=backend)
    with pytest.raises(ValueError, match="NaN"):
        draft_step(with_nan(logits), seed=0, backend=backend)
