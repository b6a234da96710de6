"""Bad input gets a ValueError that names the problem."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import draft_step, verify
from specdec_fast.kernels import SamplingParams

from helpers.backends import kernel_params

B, K, V = 2, 3, 10


def inputs():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(B, K + 1, V, generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    x = torch.randint(0, V, (B, K), generator=g)
    return target, q, x


def with_nan(t):
    """A NaN in the first row of request 0: every verifier reads it."""
    t = t.clone()
    t[0, 0, 2] = float("nan")
    return t


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda t, q, x: (with_nan(t), q, x), "contains NaN"),
        (lambda t, q, x: (t.masked_fill(torch.ones_like(t, dtype=torch.bool), float("-inf")), q, x), "every logit is -inf"),
        (lambda t, q, x: (t.clone().index_fill_(2, torch.tensor([0]), float("inf")), q, x), r"\+inf"),
        (lambda t, q, x: (t, q[..., :-1], x), "vocabulary mismatch"),
        (lambda t, q, x: (t, q[:, :-1], x), r"draft_probs must have shape"),
        (lambda t, q, x: (t, q, x[:, :-1]), r"draft_tokens must be an integer tensor of shape"),
        (lambda t, q, x: (t, q, x.float()), r"draft_tokens must be an integer tensor"),
        (lambda t, q, x: (t, q, x + V), r"outside \[0, V\)"),
        (lambda t, q, x: (t, -q, x), "non-negative probabilities"),
        (lambda t, q, x: (t[0], q, x), r"target must have shape \[B, K\+1, V\]"),
    ],
)
def test_verify_rejects(change, message):
    with pytest.raises(ValueError, match=message):
        verify(*change(*inputs()))


def with_sampling(kwargs: dict) -> dict:
    """``kwargs`` with its ``sampling`` settings made into SamplingParams (which checks them)."""
    return kwargs | ({"sampling": SamplingParams(**kwargs["sampling"])} if "sampling" in kwargs else {})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(draft_lens=torch.tensor([0, K + 1])), r"draft_lens must lie in \[0, K\]"),
        (dict(draft_lens=torch.tensor([1])), r"draft_lens must be an integer tensor of shape \[B\]"),
        (dict(uniforms=torch.zeros(B, K + 1)), r"uniforms must lie in \(0, 1\]"),
        (dict(uniforms=torch.ones(B, K)), "uniforms must have shape"),
        (dict(sampling=dict(temperature=-1.0)), "temperature"),
        (dict(sampling=dict(temperature=torch.tensor([1.0, 1.0, 1.0]))), r"temperature must be a scalar or have shape \[B\]"),
        (dict(sampling=dict(top_p=0.0)), "top_p"),
        (dict(sampling=dict(top_k=-2)), "top_k"),
        (dict(backend="nope"), "unknown backend"),
        (dict(generator=[torch.Generator()]), "got 1 generators for a batch of 2"),
    ],
)
def test_verify_rejects_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        verify(*inputs(), **with_sampling(kwargs))


def test_padding_beyond_draft_lens_is_ignored():
    """Tokens past a row's draft length may be anything, -1 included."""
    t, q, x = inputs()
    x[0, 1:] = -1
    out = verify(t, q, x, torch.tensor([1, K]), generator=torch.Generator().manual_seed(0))
    assert out.num_accepted[0] <= 1


def test_target_probs_checked():
    t, q, x = inputs()
    with pytest.raises(ValueError, match="no probability mass"):
        verify(torch.zeros_like(t), q, x, target_is_probs=True)
    with pytest.raises(ValueError, match="non-negative probabilities"):
        verify(-torch.softmax(t, -1), q, x, target_is_probs=True)


@pytest.mark.parametrize(
    "logits,kwargs,message",
    [
        (torch.randn(2, 3, 4), {}, r"logits must have shape \[B, V\]"),
        (with_nan(torch.randn(1, 2, 5))[0], {}, "contains NaN"),
        (torch.randn(2, 5), dict(uniforms=torch.zeros(2)), r"uniforms must lie in \(0, 1\]"),
        (torch.randn(2, 5), dict(sampling=dict(top_p=1.5)), "top_p"),
        (torch.randint(0, 3, (2, 5)), {}, "floating-point"),
    ],
)
def test_draft_step_rejects(logits, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draft_step(logits, **with_sampling(kwargs))


VALUE_ERRORS = {  # a bad value in rows every verifier reads: every backend's kernel raises the same error
    "NaN": (lambda t, q, x, u, n: (with_nan(t), q, x, u, n), "target contains NaN"),
    "+inf": (lambda t, q, x, u, n: (t.index_fill(2, torch.tensor([1]), float("inf")), q, x, u, n), r"target contains \+inf"),
    "-inf": (lambda t, q, x, u, n: (torch.full_like(t, float("-inf")), q, x, u, n), "every logit is -inf"),
    "token": (lambda t, q, x, u, n: (t, q, x + V, u, n), r"outside \[0, V\)"),
    "draft": (lambda t, q, x, u, n: (t, -q, x, u, n), "draft_probs must hold finite non-negative probabilities"),
    "length": (lambda t, q, x, u, n: (t, q, x, u, torch.tensor([0, K + 1])), r"draft_lens must lie in \[0, K\]"),
    "uniform": (lambda t, q, x, u, n: (t, q, x, torch.zeros_like(u), n), r"uniforms must lie in \(0, 1\]"),
}


@pytest.mark.parametrize("backend,device", [pytest.param("torch", "cpu", id="torch-cpu"), *kernel_params()])
@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.8, top_k=3, top_p=0.9)])
@pytest.mark.parametrize("case", list(VALUE_ERRORS))
def test_kernels_check_the_values_they_read(backend, device, rule, sampling, case):
    """The values are checked inside the kernels (the row's status), with the reference's message."""
    change, message = VALUE_ERRORS[case]
    t, q, x = inputs()
    t, q, x, u, lens = change(t, q, x, 1 - torch.rand(B, K + 1), torch.tensor([K, K]))
    with pytest.raises(ValueError, match=message):
        verify(t.to(device), q.to(device), x.to(device), lens.to(device), uniforms=u.to(device), sampling=sampling,
               verifier=rule, backend=backend)


@pytest.mark.parametrize("backend,device", kernel_params())
def test_rows_past_the_stop_are_not_checked(backend, device):
    """Documented: a kernel checks the rows it reads. A NaN in the target's last row when the first
    draft token is rejected changes nothing the call returns, and only the reference (which checks
    every row a verifier could read) raises."""
    t, q, x = inputs()
    t[:, 0, x[:, 0]] = float("-inf")  # p_1(X_1) = 0: every row stops at its first token
    t[:, K, 0] = float("nan")
    out = verify(t.to(device), q.to(device), x.to(device), uniforms=torch.full((B, K + 1), 0.5, device=device), backend=backend)
    assert out.num_accepted.tolist() == [0, 0]
    with pytest.raises(ValueError, match="target contains NaN"):
        verify(t, q, x, uniforms=torch.full((B, K + 1), 0.5), backend="torch")
