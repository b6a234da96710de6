"""Costs measured where the loop runs: the :class:`Calibration` a loop's policies start from.

A speculative round of k drafts costs T(k + 1) (the target's pass over k + 1 tokens), k draft
steps c, and a fixed part (the verification, the bookkeeping); a round that drafts nothing costs
what an autoregressive step costs. Each of these differs by a factor of two or more between
CPUs with the same model (a 9-token pass is 2.25 one-token passes on one 2-core Xeon, 3.2-3.9
on a 2-core EPYC), so the numbers a policy weighs are measured on the machine that decides,
for the path in use (target, precision, draft, threads), and kept in the user cache under a key
that names all of them (:func:`calibration_key`). ``specdec_fast.decoding.calibrate`` measures them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import weakref
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from ..paths import cache_root
from .costs import CostModel, expected_tokens, interpolate

CALIBRATION_VERSION = 1  # bump when what is measured, or how, changes: older files are measured again


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as lines:
            for line in lines:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def library_version() -> str:
    """The installed version (read once: asking the package metadata costs ~2 ms)."""
    try:
        return metadata.version("specdec_fast")
    except metadata.PackageNotFoundError:
        return "source"


_IDENTITIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (layout, identity)


def model_identity(model: torch.nn.Module) -> str:
    """A digest that tells two models apart: the class, the config and a sample of the weights (the
    first and last 64 values of the first and last parameter), so that another checkpoint of the
    same architecture is calibrated anew. Computed once per model object (serialising the config
    costs ~1 ms a call) and again when its parameters' number, shapes, dtypes or devices change."""
    parameters = list(model.parameters())
    ends = parameters[:1] + parameters[-1:]
    layout = (len(parameters), *((tuple(p.shape), p.dtype, p.device) for p in ends))
    cached = _IDENTITIES.get(model)
    if cached is not None and cached[0] == layout:
        return cached[1]
    digest = hashlib.sha256(type(model).__name__.encode())
    config = getattr(model, "config", None)
    if config is not None:
        digest.update(config.to_json_string(use_diff=False).encode() if hasattr(config, "to_json_string") else repr(config).encode())
    for p in ends:
        digest.update(f"{tuple(p.shape)}{p.dtype}{p.device.type}".encode())
        if p.device.type != "meta":  # a model with no data yet has nothing more to tell
            flat = p.detach().reshape(-1)
            digest.update(torch.cat([flat[:64], flat[-64:]]).float().cpu().numpy().tobytes())
    _IDENTITIES[model] = (layout, digest.hexdigest()[:16])
    return _IDENTITIES[model][1]


def calibration_key(target: str, precision: str, draft: str, build: dict, threads: int | None = None) -> dict:
    """What a calibration holds for: the CPU model, the kernels' build (arch and ISA), the threads,
    the target's identity and precision, the draft's identity, and the library's version."""
    return dict(cpu=cpu_model(), build=build, threads=threads or torch.get_num_threads(), target=target,
                precision=precision, draft=draft, version=library_version(), calibration=CALIBRATION_VERSION)


@dataclass
class Calibration:
    """One loop's measured costs, in seconds (medians of calls timed in turn).

    target_pass_s: {cached tokens: {n: T(n)}}, the target's pass over n tokens after that many
    cached ones; plain_round_s: a round that drafts nothing (one pass over the last token and one
    sampled token: an autoregressive step); draft_step_s: one draft step of one sequence (0 for a
    draft that runs no model, a lookup); round_fixed_s: what a drafting round costs beyond its
    target pass and draft steps (the verification, the bookkeeping); matmul_gflops and
    read_gbps: the fp32 rate of a large matrix product and the memory read rate on the same
    threads (what the pass's speed is judged against); seconds: how long measuring took.
    """

    key: dict
    target_pass_s: dict[int, dict[int, float]]
    plain_round_s: float
    draft_step_s: float
    round_fixed_s: float
    matmul_gflops: float
    read_gbps: float
    seconds: float
    extra: dict = field(default_factory=dict)

    def target(self, n: int) -> float:
        """T(n) at the shortest cache length measured: interpolated between the sizes measured, linear
        beyond them, and never below T(1) (a noisy slope must not make a large pass free)."""
        sizes = self.target_pass_s[min(self.target_pass_s)]
        return max(interpolate(sizes, n), sizes[min(sizes)])

    def round_s(self, k: int, draft_step_s: float | None = None) -> float:
        """Seconds of a round drafting k tokens (k = 0: a plain round)."""
        c = self.draft_step_s if draft_step_s is None else draft_step_s
        return self.plain_round_s if k == 0 else self.target(k + 1) + k * c + self.round_fixed_s

    def rate(self, alpha: float, k: int, draft_step_s: float | None = None) -> float:
        """Expected tokens per second of rounds drafting k tokens accepted i.i.d. with probability alpha."""
        return expected_tokens(alpha, k) / self.round_s(k, draft_step_s)

    def cost_model(self) -> CostModel:
        """A cost model whose priors are these measurements: T(1) the plain round, T(n >= 2) the
        pass plus the round's fixed part (a loop's round times include both), c the draft step."""
        sizes = self.target_pass_s[min(self.target_pass_s)]
        target = {1: self.plain_round_s} | {n: t + self.round_fixed_s for n, t in sizes.items() if n >= 2}
        return CostModel(max(self.draft_step_s, 1e-7), target)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        data = json.loads(text)
        data["target_pass_s"] = {int(c): {int(n): s for n, s in sizes.items()} for c, sizes in data["target_pass_s"].items()}
        return cls(**data)


def calibration_path(key: dict) -> Path:
    """The calibration's file in the user cache: one per key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "calibration" / f"{digest}.json"


def load_calibration(key: dict) -> Calibration | None:
    """The calibration stored for ``key``, or None (none stored, or one that no longer reads)."""
    path = calibration_path(key)
    try:
        calibration = Calibration.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return calibration if calibration.key == key else None


def save_calibration(calibration: Calibration) -> Path:
    """Store ``calibration`` under its key (written to a temporary file, then renamed: a reader never
    sees half a file)."""
    path = calibration_path(calibration.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(calibration.to_json())
    tmp.replace(path)
    return path
