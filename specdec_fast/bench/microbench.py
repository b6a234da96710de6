"""Microbenchmark of the verify op per backend (``benchmarks/microbench.py``, ``specdec-fast microbench``).

Times the op itself (``torch.ops.specdec_fast.*verify`` or the torch reference), the public
``verify`` call on each backend ("cpu (public)": shape checks, uniforms, the op, the status
check), and transformers' ``_speculative_sampling`` at B = 1 (the pure-torch path a
transformers user runs today). Drafts are sampled from a q close to p, so rows accept a
realistic number of tokens; "point mass" drafts are the same tokens verified as fixed
proposals (``draft_probs=None``: no q is read). The reference computes in float64 (it is the
specification); transformers' function is fp32.

Bytes model (what a fused verify must read): for each row, the target rows it visits
(accepted positions, then the stop position) in the logits' dtype, plus the draft row at
a rejected position (fp32), plus q(x) for each tested token (no draft bytes for point masses). Achieved GB/s = bytes / time,
set against the read bandwidth measured in the same run (a sum over a 1 GiB fp32 tensor).
"rows mean/max": target rows visited per request, over the batch; a kernel with one block
per request takes as long as its longest request, which the mean-based bytes model does
not see (it matters on a GPU, where each block has its own share of the bandwidth).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.generation.utils import _speculative_sampling

from ..kernels.backends import AUTO_ORDER, unavailable
from ..kernels.ops import verify
from ..kernels.reference import verify_reference
from ..kernels.registry import op
from .common import machine, markdown_table, pyplot, save_figure, time_samples, write_results


def read_bandwidth(device: str, repeats: int = 5) -> float:
    """Bytes per second of a sum over a 1 GiB fp32 tensor on ``device``."""
    x = torch.ones(1 << 28, device=device)
    return x.numel() * 4 / time_samples(lambda: x.sum(), repeats, device)["median"]


DRAFTS = ("model", "point mass")  # q read, or the drafted tokens taken as fixed proposals


def make_inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int = 0, device: str = "cpu",
                draft: str = "model"):
    """The verify op's arguments (target, q or None, point_mass, tokens, lens, temperature, top_k, top_p, u)."""
    g = torch.Generator(device).manual_seed(seed)
    on = dict(generator=g, device=device)
    logits = 2 * torch.randn(batch, k + 1, vocab, **on)
    q = torch.softmax(logits[:, :k] + 0.7 * torch.randn(batch, k, vocab, **on), -1)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    lens = torch.full((batch,), k, dtype=torch.int64, device=device)
    sampling = (torch.ones(batch, device=device), torch.zeros(batch, dtype=torch.int64, device=device),
                torch.ones(batch, device=device))
    u = 1 - torch.rand(batch, k + 1, **on)
    point = draft == "point mass"
    return (logits.to(dtype), None if point else q, torch.full((batch,), point, device=device), x, lens, *sampling, u)


def bytes_read(args, num_accepted: torch.Tensor) -> int:
    logits, q = args[0], args[1]
    vocab, k = logits.shape[-1], logits.shape[1] - 1
    rows = (num_accepted + 1).sum().item()
    if q is None:
        return rows * vocab * logits.element_size()
    rejected = (num_accepted < k).sum().item()
    return rows * vocab * logits.element_size() + rejected * vocab * 4 + (num_accepted + 1).clamp(max=k).sum().item() * 4


def public_call(args, backend: str):
    """The public verify() on the op's inputs: what a user pays, checks and all."""
    logits, q, _, x, lens, *_, u = args
    return lambda: verify(logits, q, x, lens, uniforms=u, backend=backend)


def hf_speculative_sampling(args):
    logits, q, x = args[0], args[1], args[3]
    # Older transformers (5.17, say) also take is_done_candidate (whether the draft ended on EOS).
    older = "is_done_candidate" in inspect.signature(_speculative_sampling).parameters
    extra = dict(is_done_candidate=False) if older else {}
    return lambda: _speculative_sampling(x, q.log(), x.shape[1], logits.float(), **extra)


def run(batches, lengths, vocabs, dtypes, repeats: int = 5, device: str = "cpu", out: Path = Path("results/microbench"),
        drafts=DRAFTS) -> dict:
    """Time every backend that runs on ``device`` over the grid, raw op and public call; writes ``out``.{json,md,png}."""
    backends = [name for name in AUTO_ORDER[device] if unavailable(name) is None]
    bandwidth = read_bandwidth(device)
    rows = []
    grid = list(itertools.product(batches, lengths, vocabs, dtypes, drafts))
    for batch, k, vocab, dtype, draft in tqdm(grid, desc="microbench"):
        args = make_inputs(batch, k, vocab, dtype, device=device, draft=draft)
        accepted = verify_reference(*args)[0]
        moved = bytes_read(args, accepted)
        visited = dict(rows_mean=(accepted + 1).float().mean().item(), rows_max=(accepted + 1).max().item())
        calls = {"torch": lambda: verify_reference(*args)}
        for name in backends:
            calls[name] = functools.partial(op("verify", name), *args)
            calls[f"{name} (public)"] = public_call(args, name)
        # The float64 reference is slow at the large sizes: fewer repeats keep the run short.
        times = {name: time_samples(fn, repeats if name != "torch" else 3, device) for name, fn in calls.items()}
        hf = (time_samples(hf_speculative_sampling(args), repeats, device)["median"]
              if batch == 1 and draft == "model" else None)
        for name, t in times.items():
            rows.append(dict(B=batch, K=k, V=vocab, dtype=str(dtype).removeprefix("torch."), draft=draft, backend=name,
                             **visited, public_vs_op=t["median"] / times[name.removesuffix(" (public)")]["median"],
                             ms=t["median"] * 1e3, ms_p20=t["p20"] * 1e3, ms_p80=t["p80"] * 1e3,
                             speedup_vs_torch=times["torch"]["median"] / t["median"],
                             speedup_vs_hf=hf / t["median"] if hf else None,
                             gbps=moved / t["median"] / 1e9, bandwidth_fraction=moved / t["median"] / bandwidth))
    data = dict(machine=machine(), device=device, read_bandwidth_gbps=bandwidth / 1e9, rows=rows)
    write_results(out, data, table(data))
    plot(data, out)
    return data


def table(data: dict) -> str:
    head = ["B", "K", "V", "dtype", "draft", "rows mean/max", "backend", "ms (p20-p80)", "x torch", "x HF",
            "public / op", "GB/s", "of read BW"]
    body = [[r["B"], r["K"], r["V"], r["dtype"], r["draft"], f"{r['rows_mean']:.2g}/{r['rows_max']}", r["backend"],
             f"{r['ms']:.3g} ({r['ms_p20']:.3g}-{r['ms_p80']:.3g})",
             r["speedup_vs_torch"], r["speedup_vs_hf"] if r["speedup_vs_hf"] is not None else "-",
             r["public_vs_op"] if r["backend"].endswith("(public)") else "-", r["gbps"],
             r["bandwidth_fraction"]] for r in data["rows"]]
    return (markdown_table(head, body) + f"\n\nDevice: {data['device']}. Measured read bandwidth: "
            f"{data['read_bandwidth_gbps']:.1f} GB/s.")


def plot(data: dict, out: Path) -> None:
    """Fraction of the read bandwidth per backend vs B (K = max, fp32), one line per V."""
    plt = pyplot()
    kernels = sorted({r["backend"] for r in data["rows"] if not r["backend"].endswith("(public)")} - {"torch"})
    k = max(r["K"] for r in data["rows"])
    fig, axes = plt.subplots(1, max(1, len(kernels)), figsize=(5 * max(1, len(kernels)), 4), squeeze=False)
    for ax, name in zip(axes[0], kernels):
        for vocab in sorted({r["V"] for r in data["rows"]}):
            pts = sorted((r["B"], r["bandwidth_fraction"]) for r in data["rows"]
                         if r["backend"] == name and r["V"] == vocab and r["K"] == k and r["dtype"] == "float32"
                         and r["draft"] == "model")
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"V={vocab}")
        ax.set(xscale="log", xlabel="batch B", ylabel="fraction of measured read bandwidth",
               title=f"{name} verify, K={k}, fp32 logits", ylim=(0, 1))
        ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)
