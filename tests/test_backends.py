"""Every kernel backend that runs here against the torch reference on the same uniforms:
same tokens and counts; probabilities and features within the tolerances below."""

from __future__ import annotations

import importlib

import pytest
import torch

from specdec_fast import backends, draft_step, verify

CPU_BACKENDS = ["cpu"]  # kernels that run on this machine's CPU (tested against "torch")
# Stated tolerances (fp32 outputs). The softmax normaliser and the entropy are sums over V
# terms, which the reference adds in fp32 and the kernels in double: at V = 262,144 that
# alone moves probabilities by ~1e-5 relative.
TOLERANCE = {"probs": dict(rtol=3e-5, atol=1e-7), "token_prob": dict(rtol=3e-5, atol=1e-7),
             "entropy": dict(rtol=1e-4, atol=1e-5), "top1_prob": dict(rtol=3e-5, atol=1e-7)}
SETTINGS = {  # name: (temperature, top_k, top_p) per row, mixed inside one batch
    "plain": ([1.0], [0], [1.0]),
    "mixed": ([0.0, 0.7, 1.0, 1.3], [0, 0, 20, 5], [1.0, 0.9, 1.0, 0.8]),
}


def make_inputs(batch, k, vocab, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, k + 1, vocab, generator=g)).to(dtype)
    q = torch.softmax(3 * torch.randn(batch, k, vocab, generator=g), -1)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k) if k else torch.zeros(batch, 0, dtype=torch.int64)
    # make some drafts likely to be accepted: copy the target's argmax into a few positions
    take = torch.rand(batch, k, generator=g) < 0.5
    x = torch.where(take, logits[:, :k].float().argmax(-1), x)
    lens = torch.randint(0, k + 1, (batch,), generator=g)
    u = 1 - torch.rand(batch, k + 1, generator=g)
    return logits, q, x, lens, u


def per_row(setting, batch):
    t, k, p = SETTINGS[setting]
    repeat = lambda v, dt: torch.tensor((v * batch)[:batch], dtype=dt)  # noqa: E731
    return dict(temperature=repeat(t, torch.float32), top_k=repeat(k, torch.int64), top_p=repeat(p, torch.float32))


def test_backends_reports_every_backend():
    status = backends()
    assert status["torch"] is None and set(CPU_BACKENDS) <= set(status)
    for name in CPU_BACKENDS:
        assert status[name] is None, f"{name} backend failed to build/load here: {status[name]}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,k,vocab", [(1, 1, 41), (7, 4, 401), (4, 8, 1271), (3, 0, 32_000), (2, 3, 49_152), (2, 2, 262_144)])
def test_verify_matches_reference(backend, setting, dtype, batch, k, vocab):
    logits, q, x, lens, u = make_inputs(batch, k, vocab, dtype, seed=batch * 1000 + k * 10 + vocab)
    params = per_row(setting, batch)
    ref = verify(logits, q, x, lens, uniforms=u, backend="torch", **params)
    out = verify(logits, q, x, lens, uniforms=u, backend=backend, **params)
    mismatch = (ref.tokens != out.tokens).any(-1).nonzero().flatten().tolist()
    assert not mismatch, f"rows {mismatch} differ: {ref.tokens[mismatch]} vs {out.tokens[mismatch]}"
    assert torch.equal(ref.num_accepted, out.num_accepted) and torch.equal(ref.num_emitted, out.num_emitted)
    assert ((out.tokens[:, : k + 1] >= -1) & (out.tokens < vocab)).all()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,vocab", [(1, 41), (9, 401), (4, 49_152), (2, 262_144)])
def test_draft_step_matches_reference(backend, setting, dtype, batch, vocab):
    g = torch.Generator().manual_seed(vocab + batch)
    logits = (3 * torch.randn(batch, vocab, generator=g)).to(dtype)
    u = 1 - torch.rand(batch, generator=g)
    params = per_row(setting, batch)
    ref = draft_step(logits, uniforms=u, backend="torch", **params)
    out = draft_step(logits, uniforms=u, backend=backend, **params)
    assert torch.equal(ref.tokens, out.tokens)
    for name, tolerance in TOLERANCE.items():
        torch.testing.assert_close(getattr(out, name), getattr(ref, name), **tolerance, msg=name)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_masked_and_tied_logits(backend):
    """-inf entries are never drawn; ties keep the first argmax in greedy rows."""
    logits = torch.full((3, 2, 10), float("-inf"))
    logits[:, :, 3] = 1.0
    logits[:, :, 7] = 1.0
    q = torch.zeros(3, 1, 10)
    q[..., 7] = 1.0
    x = torch.full((3, 1), 7)
    for temperature in (0.0, 1.0):
        out = verify(logits, q, x, uniforms=torch.tensor([[0.3, 1e-7], [0.9, 0.5], [1.0, 1.0]]),
                     temperature=temperature, backend=backend)
        ref = verify(logits, q, x, uniforms=torch.tensor([[0.3, 1e-7], [0.9, 0.5], [1.0, 1.0]]),
                     temperature=temperature, backend="torch")
        assert torch.equal(out.tokens, ref.tokens)
        assert set(out.tokens[out.tokens >= 0].tolist()) <= {3, 7}


def test_explicit_backend_on_wrong_device_raises():
    logits, q, x, lens, u = make_inputs(1, 1, 8, torch.float32, 0)
    with pytest.raises(ValueError, match="unknown backend"):
        verify(logits, q, x, lens, uniforms=u, backend="tpu")


def test_opcheck_registered_ops():
    """torch.library.opcheck: schema, fake (meta) implementation and dispatch of the custom ops."""
    backends()  # builds and registers the CPU kernels
    logits, q, x, lens, u = make_inputs(3, 4, 97, torch.float32, 1)
    params = per_row("mixed", 3)
    sampling = (params["temperature"], params["top_k"], params["top_p"])
    torch.library.opcheck(torch.ops.specdec_fast.verify.default, (logits, q, x, lens, *sampling, u))
    torch.library.opcheck(torch.ops.specdec_fast.draft_step.default, (logits[:, 0], *sampling, u[:, 0]))


def test_auto_falls_back_with_one_warning_and_explicit_backend_raises(monkeypatch):
    backends_module = importlib.import_module("specdec_fast.backends")  # the module, not the function

    def broken():
        raise RuntimeError("compiler exploded")

    monkeypatch.setitem(backends_module.LOADERS, "cpu", broken)
    backends_module._warn_once.cache_clear()
    logits, q, x, lens, u = make_inputs(2, 2, 16, torch.float32, 0)
    with pytest.warns(RuntimeWarning, match="cpu kernels unavailable.*compiler exploded") as record:
        for _ in range(3):
            verify(logits, q, x, lens, uniforms=u)
    assert len(record) == 1
    assert backends_module.backends()["cpu"] == "compiler exploded"
    with pytest.raises(RuntimeError, match="compiler exploded"):
        verify(logits, q, x, lens, uniforms=u, backend="cpu")
