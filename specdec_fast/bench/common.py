"""What every benchmark shares: timing, the machine's description, and writing results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import transformers

from ..kernels.build import cpu_build
from ..policies.measure import medians_in_turn


def machine() -> dict:
    """The machine, the CPU kernels' build (its -march and vector ISA) and library versions, recorded
    with every result."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return dict(
        cpu=cpu, cores=os.cpu_count(), kernels=cpu_build(), torch_threads=torch.get_num_threads(), torch=torch.__version__,
        transformers=transformers.__version__, cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )


def time_samples(fn: Callable[[], object], repeats: int, device: str = "cpu", warmup: int = 2) -> dict:
    """Wall time of ``fn()`` in seconds over ``repeats`` runs: median, 20th and 80th percentiles."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    at = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return dict(median=statistics.median(times), p20=at(0.2), p80=at(0.8))


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds (CPU)."""
    return medians_in_turn([fn], repeats, warmup)[0]


def write_results(out: Path, data: dict, table: str) -> Path:
    """Write ``out``.json and ``out``.md (``out``: a folder and a file name without suffix, the folder
    made if missing) and say where; returns the JSON path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    path.write_text(json.dumps(data, indent=1))
    m = data["machine"]
    gpu = f"{m['cuda']} GPU, " if m.get("cuda") else ""
    build = m["kernels"]
    header = (f"Machine: {gpu}{m['cpu']}, {m['cores']} cores, {m['torch_threads']} threads, CPU kernels {build['isa']} "
              f"(-march={build['arch']}; this CPU: {build['native']}), torch {m['torch']}, transformers {m['transformers']}, "
              f"{m['date']}.\n\n")
    out.with_suffix(".md").write_text(header + table + "\n")
    print(f"results: {path} and {out.with_suffix('.md')}")
    return path


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot with a file-only backend. Imported when a benchmark draws, not before:
    matplotlib takes ~0.5 s to import and only the plots need it."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install 'specdec_fast[bench]'") from error

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: Path, dpi: int = 110) -> Path:
    """Save ``fig`` as ``out``.png (the folder made if missing, nothing clipped); returns the path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path
