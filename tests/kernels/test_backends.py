"""Every kernel backend against the torch reference on the same uniforms: same tokens and
counts; probabilities and features within the tolerances below. Plus the builds (the CUDA
extension compiles and links here, the Triton kernels compile for sm_90), opcheck, and the
dispatcher's fallback."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from specdec_fast import backends, draft_step, philox_uniforms, verify, warp_logits
from specdec_fast.kernels import SamplingParams
from specdec_fast.kernels.philox import philox4x32

from helpers.agreement import assert_same_draws
from helpers.backends import kernel_params

# Stated tolerances (fp32 outputs). The reference computes in float64 and rounds once; the
# kernels use fp32 exps (a few ulp) with normalisers summed in double.
TOLERANCE = {"probs": dict(rtol=2e-6, atol=1e-9), "token_prob": dict(rtol=2e-6, atol=1e-9),
             "entropy": dict(rtol=2e-5, atol=2e-6), "top1_prob": dict(rtol=2e-6, atol=1e-9)}
SETTINGS = {  # name: (temperature, top_k, top_p) per row, mixed inside one batch
    "plain": ([1.0], [0], [1.0]),
    "mixed": ([0.0, 0.7, 1.0, 1.3], [0, 0, 20, 5], [1.0, 0.9, 1.0, 0.8]),
}
SHAPES = [(1, 1, 41), (7, 4, 401), (4, 8, 1271), (3, 0, 32_000), (2, 3, 49_152), (2, 2, 262_144)]


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
    return dict(sampling=SamplingParams(repeat(t, torch.float32), repeat(k, torch.int64), repeat(p, torch.float32)))


def to(device, *tensors):
    return [t.to(device) for t in tensors]


def test_backends_reports_every_backend():
    status = backends()
    assert status["torch"] is None and set(status) == {"torch", "cpu", "cuda", "triton"}
    assert status["cpu"] is None, f"cpu backend failed to build/load here: {status['cpu']}"
    if not torch.cuda.is_available():
        assert status["cuda"] == "no CUDA device"


@pytest.mark.parametrize("backend,device", kernel_params())
@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,k,vocab", SHAPES)
def test_verify_matches_reference(backend, device, rule, setting, dtype, batch, k, vocab):
    if (backend, device, vocab) == ("triton", "cpu", 262_144) and (rule == "block" or dtype != torch.float32):
        pytest.skip("Triton interpreter (no GPU): this size runs on the GPU; interpreted, fp32 token-wise covers it "
                    "(2-byte logits take the path tested at 49,152, block verification reads every row)")
    logits, q, x, lens, u = make_inputs(batch, k, vocab, dtype, seed=batch * 1000 + k * 10 + vocab)
    params = per_row(setting, batch)
    ref = verify(logits, q, x, lens, uniforms=u, backend="torch", verifier=rule, **params)
    out = verify(*to(device, logits, q, x, lens), uniforms=u.to(device), backend=backend, verifier=rule, **params)
    assert torch.equal(out.num_emitted.cpu(), out.num_accepted.cpu() + 1)
    expand = lambda t: t[:, None].expand(batch, k + 1)  # noqa: E731
    assert_same_draws(ref, out, warp_logits(logits, *(expand(t) for t in params["sampling"].as_tensors(batch))))


@pytest.mark.parametrize("backend,device", kernel_params())
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,vocab", [(1, 41), (9, 401), (4, 49_152), (2, 262_144)])
def test_draft_step_matches_reference(backend, device, setting, dtype, batch, vocab):
    if (backend, device, vocab) == ("triton", "cpu", 262_144) and dtype != torch.float32:
        pytest.skip("Triton interpreter (no GPU): this size runs on the GPU; interpreted, fp32 covers it "
                    "(2-byte logits take the path tested at 49,152)")
    g = torch.Generator().manual_seed(vocab + batch)
    logits = (3 * torch.randn(batch, vocab, generator=g)).to(dtype)
    u = 1 - torch.rand(batch, generator=g)
    params = per_row(setting, batch)
    ref = draft_step(logits, uniforms=u, backend="torch", **params)
    out = draft_step(logits.to(device), uniforms=u.to(device), backend=backend, **params)
    assert torch.equal(ref.tokens, out.tokens.cpu())
    for name, tolerance in TOLERANCE.items():
        torch.testing.assert_close(getattr(out, name).cpu(), getattr(ref, name), **tolerance, msg=name)


@pytest.mark.parametrize("backend,device", kernel_params())
def test_masked_and_tied_logits(backend, device):
    """-inf entries are never drawn; ties keep the first argmax in greedy rows."""
    logits = torch.full((3, 2, 10), float("-inf"))
    logits[:, :, 3] = 1.0
    logits[:, :, 7] = 1.0
    q = torch.zeros(3, 1, 10)
    q[..., 7] = 1.0
    x = torch.full((3, 1), 7)
    u = torch.tensor([[0.3, 1e-7], [0.9, 0.5], [1.0, 1.0]])
    for temperature in (0.0, 1.0):
        ref = verify(logits, q, x, uniforms=u, sampling=SamplingParams(temperature), backend="torch")
        out = verify(*to(device, logits, q, x), uniforms=u.to(device), sampling=SamplingParams(temperature), backend=backend)
        assert torch.equal(out.tokens.cpu(), ref.tokens)
        assert set(ref.tokens[ref.tokens >= 0].tolist()) <= {3, 7}


def test_philox_reference_matches_known_answers():
    """Random123's known-answer vectors for Philox4x32-10."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, expected in cases:
        out = philox4x32(tuple(torch.tensor([c]) for c in counter), tuple(torch.tensor([k]) for k in key))
        assert tuple(int(o) for o in out) == expected


@pytest.mark.parametrize("backend,device", kernel_params())
def test_philox_uniforms_same_bits_as_reference(backend, device):
    seed = torch.tensor([0, 1, 2**40 + 3, -5])
    offset = torch.tensor([0, 2**32 - 2, 7, 2**62])  # counters crossing the 32-bit word boundary
    ref = philox_uniforms(seed, offset, 37, backend="torch")
    assert torch.equal(philox_uniforms(seed.to(device), offset.to(device), 37, backend=backend).cpu(), ref)
    assert bool(((ref > 0) & (ref <= 1)).all())


@pytest.mark.parametrize("backend,device", kernel_params())
def test_seeded_rows_do_not_depend_on_the_batch(backend, device):
    """With per-request (seed, offset) a row's result is the same alone or in any batch."""
    logits, q, x, lens, _ = make_inputs(6, 3, 97, torch.float32, 3)
    seeds, offsets = torch.arange(6) * 1000 + 17, torch.arange(6) * 4
    args = to(device, logits, q, x, lens)
    full = verify(*args, seed=seeds.to(device), offset=offsets.to(device), backend=backend)
    perm = torch.tensor([4, 1, 5, 0])
    part = verify(*(a[perm.to(device)] for a in args), seed=seeds[perm].to(device), offset=offsets[perm].to(device),
                  backend=backend)
    assert torch.equal(full.tokens[perm.to(device)].cpu(), part.tokens.cpu())
    ref = verify(logits, q, x, lens, seed=seeds, offset=offsets, backend="torch")
    assert torch.equal(full.tokens.cpu(), ref.tokens)


def zeros(shape, dtype, device):
    """A zero tensor; on the CPU backed by untouched (zero) pages, so reading it costs no memory."""
    if device != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    storage = np.zeros(int(np.prod(shape)) * dtype.itemsize // 2, dtype=np.int16)  # calloc: lazily zeroed
    return torch.from_numpy(storage).view(dtype).reshape(shape)


@pytest.mark.parametrize("backend,device", kernel_params(interpreter_too_slow="a 2^31-element batch needs the GPU, not the interpreter"))
def test_offsets_beyond_32_bits(backend, device):
    """The last row of a batch starts 2^31 elements in: its result equals the reference's on that row alone."""
    batch, vocab = 4097, 262_144  # 4096 * 2 * 262,144 = 2^31
    logits, q = zeros((batch, 2, vocab), torch.bfloat16, device), zeros((batch, 1, vocab), torch.float32, device)
    last_logits, last_q, last_x, _, last_u = make_inputs(1, 1, vocab, torch.bfloat16, seed=11)
    logits[-1], q[-1] = last_logits[0].to(device), last_q[0].to(device)
    x = torch.zeros(batch, 1, dtype=torch.int64, device=device)
    x[-1] = last_x[0].to(device)
    u = torch.full((batch, 2), 0.5, device=device)
    u[-1] = last_u[0].to(device)
    out = verify(logits, q, x, uniforms=u, backend=backend)
    ref = verify(last_logits, last_q, last_x, uniforms=last_u, backend="torch")
    assert torch.equal(out.tokens[-1:].cpu(), ref.tokens)


@pytest.mark.parametrize("backend,device", kernel_params())
def test_opcheck_registered_ops(backend, device):
    """torch.library.opcheck: schema, fake (meta) implementation and dispatch of the custom ops."""
    assert backends()[backend] is None  # loads the backend, registering its implementations
    prefix = "triton_" if backend == "triton" else ""
    logits, q, x, lens, u = to(device, *make_inputs(3, 4, 97, torch.float32, 1))
    sampling = per_row("mixed", 3)["sampling"].as_tensors(3, device)
    ops = torch.ops.specdec_fast
    mixed = torch.tensor([True, False, True], device=device)
    for name in ("verify", "verify_block"):
        torch.library.opcheck(getattr(ops, prefix + name).default, (logits, q, mixed, x, lens, *sampling, u))
        torch.library.opcheck(getattr(ops, prefix + name).default, (logits, None, mixed | True, x, lens, *sampling, u))
    torch.library.opcheck(getattr(ops, prefix + "draft_step").default, (logits[:, 0], *sampling, u[:, 0]))
    seed = torch.arange(3, device=device)
    torch.library.opcheck(getattr(ops, prefix + "philox_uniforms").default, (seed, seed * 7, 5))


@pytest.mark.parametrize("backend,device", kernel_params())
def test_ops_trace_under_torch_compile(backend, device):
    """The fake implementations let torch.compile trace the ops without a graph break."""
    assert backends()[backend] is None  # loads the backend, registering its implementations
    prefix = "triton_" if backend == "triton" else ""
    verify_op = getattr(torch.ops.specdec_fast, prefix + "verify")
    logits, q, x, lens, u = to(device, *make_inputs(2, 3, 50, torch.float32, 4))
    sampling = per_row("plain", 2)["sampling"].as_tensors(2, device)

    def accepted_plus_one(*args):
        return verify_op(*args)[0] + 1

    compiled = torch.compile(accepted_plus_one, fullgraph=True, backend="aot_eager")
    args = (logits, q, torch.zeros(2, dtype=torch.bool, device=device), x, lens, *sampling, u)
    assert torch.equal(compiled(*args), accepted_plus_one(*args))


@pytest.mark.slow
def test_cuda_extension_compiles_and_links():
    """csrc/cuda builds with nvcc and loads here; running its kernels needs a GPU (the tests above)."""
    from specdec_fast.kernels.build import build_cuda

    if torch.version.cuda is None:
        pytest.skip(f"CUDA toolchain absent: torch {torch.__version__} is a CPU-only build")
    build_cuda()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specdec_fast::verify", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specdec_fast::verify_block", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specdec_fast::draft_step", "CUDA")


@pytest.mark.slow
def test_triton_kernels_compile_for_sm90():
    """The Triton kernels compile to sm_90 cubins without a GPU (in a process without the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "specdec_fast._triton.aot", "--arch", "90"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for kernel in ("verify", "verify_block", "draft_step", "philox"):
        assert re.search(rf"^{kernel}: [1-9]\d* bytes of sm_90 cubin$", done.stdout, re.M), done.stdout


def test_auto_falls_back_with_one_warning_and_explicit_backend_raises(monkeypatch):
    backends_module = importlib.import_module("specdec_fast.kernels.backends")  # the module, not the function

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


def test_unknown_or_misplaced_backend_raises():
    logits, q, x, lens, u = make_inputs(1, 1, 8, torch.float32, 0)
    with pytest.raises(ValueError, match="unknown backend"):
        verify(logits, q, x, lens, uniforms=u, backend="tpu")
    with pytest.raises(ValueError, match="does not run on cpu tensors"):
        verify(logits, q, x, lens, uniforms=u, backend="cuda")


