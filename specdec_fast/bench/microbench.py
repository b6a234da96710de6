"""Microbenchmark of the verify op per backend (``benchmarks/microbench.py``, ``specdec-fast microbench``).

Times the op itself (``torch.ops.specdec_fast.*verify`` or the torch reference) on inputs
already checked, and transformers' ``_speculative_sampling`` at B = 1 (the pure-torch path
a transformers user runs today). Drafts are sampled from a q close to p, so rows accept a
realistic number of tokens. The reference computes in float64 (it is the specification);
transformers' function is fp32.

Bytes model (what a fused verify must read): for each row, the target rows it visits
(accepted positions, then the stop position) in the logits' dtype, plus the draft row at
a rejected position (fp32), plus q(x) for each tested token. Achieved GB/s = bytes / time,
set against the read bandwidth measured in the same run (a sum over a 1 GiB fp32 tensor).
"rows mean/max": target rows visited per request, over the batch; a kernel with one block
per request takes as long as its longest request, which the mean-based bytes model does
not see (it matters on a GPU, where each block has its own share of the bandwidth).
"""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.generation.utils import _speculative_sampling

from ..kernels.backends import AUTO_ORDER, unavailable
from ..kernels.reference import verify_reference
from ..kernels.registry import op
from .common import machine, markdown_table, pyplot, save_figure, time_samples, write_results


def read_bandwidth(device: str, repeats: int = 5) -> float:
    """Bytes per second of a sum over a 1 GiB fp32 tensor on ``device``."""
    x = torch.ones(1 << 28, device=device)
    return x.numel() * 4 / time_samples(lambda: x.sum(), repeats, device)["median"]


def make_inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int = 0, device: str = "cpu"):
    g = torch.Generator(device).manual_seed(seed)
    on = dict(generator=g, device=device)
    logits = 2 * torch.randn(batch, k + 1, vocab, **on)
    q = torch.softmax(logits[:, :k] + 0.7 * torch.randn(batch, k, vocab, **on), -1)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    lens = torch.full((batch,), k, dtype=torch.int64, device=device)
    sampling = (torch.ones(batch, device=device), torch.zeros(batch, dtype=torch.int64, device=device),
                torch.ones(batch, device=device))
    u = 1 - torch.rand(batch, k + 1, **on)
    return (logits.to(dtype), q, x, lens, *sampling, u)


def bytes_read(args, num_accepted: torch.Tensor) -> int:
    logits, q = args[0], args[1]
    vocab, k = logits.shape[-1], q.shape[1]
    rows = (num_accepted + 1).sum().item()
    rejected = (num_accepted < k).sum().item()
    return rows * vocab * logits.element_size() + rejected * vocab * 4 + (num_accepted + 1).clamp(max=k).sum().item() * 4


def hf_speculative_sampling(args):
    logits, q, x = args[0], args[1], args[2]
    # Older transformers (5.17, say) also take is_done_candidate (whether the draft ended on EOS).
    older = "is_done_candidate" in inspect.signature(_speculative_sampling).parameters
    extra = dict(is_done_candidate=False) if older else {}
    return lambda: _speculative_sampling(x, q.log(), x.shape[1], logits.float(), **extra)


def run(batches, lengths, vocabs, dtypes, repeats: int = 5, device: str = "cpu", out: Path = Path("results/microbench")) -> dict:
    """Time every backend that runs on ``device`` over the grid; writes ``out``.{json,md,png}."""
    kernels = {"torch": verify_reference}
    kernels |= {name: op("verify", name) for name in AUTO_ORDER[device] if unavailable(name) is None}
    bandwidth = read_bandwidth(device)
    rows = []
    grid = list(itertools.product(batches, lengths, vocabs, dtypes))
    for batch, k, vocab, dtype in tqdm(grid, desc="microbench"):
        args = make_inputs(batch, k, vocab, dtype, device=device)
        accepted = verify_reference(*args).num_accepted
        moved = bytes_read(args, accepted)
        visited = dict(rows_mean=(accepted + 1).float().mean().item(), rows_max=(accepted + 1).max().item())
        # The float64 reference is slow at the large sizes: fewer repeats keep the run short.
        times = {name: time_samples(lambda: fn(*args), repeats if name != "torch" else 3, device)
                 for name, fn in kernels.items()}
        hf = time_samples(hf_speculative_sampling(args), repeats, device)["median"] if batch == 1 else None
        for name, t in times.items():
            rows.append(dict(B=batch, K=k, V=vocab, dtype=str(dtype).removeprefix("torch."), backend=name, **visited,
                             ms=t["median"] * 1e3, ms_p20=t["p20"] * 1e3, ms_p80=t["p80"] * 1e3,
                             speedup_vs_torch=times["torch"]["median"] / t["median"],
                             speedup_vs_hf=hf / t["median"] if hf else None,
                             gbps=moved / t["median"] / 1e9, bandwidth_fraction=moved / t["median"] / bandwidth))
    data = dict(machine=machine(), device=device, read_bandwidth_gbps=bandwidth / 1e9, rows=rows)
    write_results(out, data, table(data))
    plot(data, out)
    return data


def table(data: dict) -> str:
    head = ["B", "K", "V", "dtype", "rows mean/max", "backend", "ms (p20-p80)", "x torch", "x HF", "GB/s", "of read BW"]
    body = [[r["B"], r["K"], r["V"], r["dtype"], f"{r['rows_mean']:.2g}/{r['rows_max']}", r["backend"],
             f"{r['ms']:.3g} ({r['ms_p20']:.3g}-{r['ms_p80']:.3g})",
             r["speedup_vs_torch"], r["speedup_vs_hf"] if r["speedup_vs_hf"] is not None else "-", r["gbps"],
             r["bandwidth_fraction"]] for r in data["rows"]]
    return (markdown_table(head, body) + f"\n\nDevice: {data['device']}. Measured read bandwidth: "
            f"{data['read_bandwidth_gbps']:.1f} GB/s.")


def plot(data: dict, out: Path) -> None:
    """Fraction of the read bandwidth per backend vs B (K = max, fp32), one line per V."""
    plt = pyplot()
    kernels = sorted({r["backend"] for r in data["rows"]} - {"torch"})
    k = max(r["K"] for r in data["rows"])
    fig, axes = plt.subplots(1, max(1, len(kernels)), figsize=(5 * max(1, len(kernels)), 4), squeeze=False)
    for ax, name in zip(axes[0], kernels):
        for vocab in sorted({r["V"] for r in data["rows"]}):
            pts = sorted((r["B"], r["bandwidth_fraction"]) for r in data["rows"]
                         if r["backend"] == name and r["V"] == vocab and r["K"] == k and r["dtype"] == "float32")
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"V={vocab}")
        ax.set(xscale="log", xlabel="batch B", ylabel="fraction of measured read bandwidth",
               title=f"{name} verify, K={k}, fp32 logits", ylim=(0, 1))
        ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)
