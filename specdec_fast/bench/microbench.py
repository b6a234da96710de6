"""Microbenchmark of the verify op per backend (``benchmarks/microbench.py``, ``specdec-fast microbench``).

Times the op itself (``torch.ops.specdec_fast.verify`` or the torch reference) on inputs
already checked, and separately transformers' ``_speculative_sampling`` at B = 1 (the
pure-torch path a transformers user runs today). Drafts are sampled from a q close to p,
so rows accept a realistic number of tokens.

Bytes model (what a fused verify must read): for each row, the target rows it visits
(accepted positions, then the stop position) in the logits' dtype, plus the draft row at
a rejected position (fp32), plus q(x) for each tested token. Achieved GB/s = bytes / time,
set against the read bandwidth measured in the same run (a sum over a 1 GiB fp32 tensor).
"""

from __future__ import annotations

import itertools

import torch
from tqdm import tqdm

from ..backends import backends
from ..reference import verify_reference
from .common import machine, markdown_table, median_time, write_results


def read_bandwidth(repeats: int = 5) -> float:
    """Bytes per second of a sum over a 1 GiB fp32 tensor."""
    x = torch.ones(1 << 28)
    return x.numel() * 4 / median_time(lambda: x.sum(), repeats)


def make_inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(batch, k + 1, vocab, generator=g)
    q = torch.softmax(logits[:, :k] + 0.7 * torch.randn(batch, k, vocab, generator=g), -1)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    lens = torch.full((batch,), k, dtype=torch.int64)
    sampling = (torch.ones(batch), torch.zeros(batch, dtype=torch.int64), torch.ones(batch))
    u = 1 - torch.rand(batch, k + 1, generator=g)
    return (logits.to(dtype), q, x, lens, *sampling, u)


def bytes_read(args, num_accepted: torch.Tensor) -> int:
    logits, q = args[0], args[1]
    vocab, k = logits.shape[-1], q.shape[1]
    rows = (num_accepted + 1).sum().item()
    rejected = (num_accepted < k).sum().item()
    return rows * vocab * logits.element_size() + rejected * vocab * 4 + (num_accepted + 1).clamp(max=k).sum().item() * 4


def hf_speculative_sampling(args):
    from transformers.generation.utils import _speculative_sampling

    logits, q, x = args[0], args[1], args[2]
    return lambda: _speculative_sampling(x, q.log(), x.shape[1], logits.float())


def run(batches, lengths, vocabs, dtypes, repeats: int = 5, out_name: str = "microbench") -> dict:
    available = [name for name, why in backends().items() if why is None]
    kernels = {"torch": lambda a: verify_reference(*a)}
    kernels |= {name: (lambda a: torch.ops.specdec_fast.verify(*a)) for name in available if name != "torch"}
    bandwidth = read_bandwidth()
    rows = []
    grid = list(itertools.product(batches, lengths, vocabs, dtypes))
    for batch, k, vocab, dtype in tqdm(grid, desc="microbench"):
        args = make_inputs(batch, k, vocab, dtype)
        accepted = verify_reference(*args).num_accepted
        moved = bytes_read(args, accepted)
        times = {name: median_time(lambda: fn(args), repeats) for name, fn in kernels.items()}
        if batch == 1:
            times["hf"] = median_time(hf_speculative_sampling(args), repeats)
        for name, t in times.items():
            if name == "hf":
                continue
            rows.append(dict(B=batch, K=k, V=vocab, dtype=str(dtype).removeprefix("torch."), backend=name, ms=t * 1e3,
                             speedup_vs_torch=times["torch"] / t, speedup_vs_hf=times["hf"] / t if "hf" in times else None,
                             gbps=moved / t / 1e9, bandwidth_fraction=moved / t / bandwidth))
    data = dict(machine=machine(), read_bandwidth_gbps=bandwidth / 1e9, rows=rows)
    write_results(out_name, data, table(data))
    return data


def table(data: dict) -> str:
    head = ["B", "K", "V", "dtype", "backend", "ms", "x torch", "x HF", "GB/s", "of read BW"]
    body = [[r["B"], r["K"], r["V"], r["dtype"], r["backend"], r["ms"], r["speedup_vs_torch"],
             r["speedup_vs_hf"] if r["speedup_vs_hf"] is not None else "-", r["gbps"], r["bandwidth_fraction"]]
            for r in data["rows"]]
    return markdown_table(head, body) + f"\n\nMeasured read bandwidth: {data['read_bandwidth_gbps']:.1f} GB/s."
