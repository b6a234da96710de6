"""llama.cpp on the same weights, as an optional peer of the pass benchmark (``pip install
.[peer]`` builds llama-cpp-python from source).

The GGUF files are converted from the very checkpoint our loader uses (F32 and BF16), by the
converter that llama.cpp ships (``convert_hf_to_gguf.py``, in the llama-cpp-python source
distribution, fetched once with ``pip download`` into the cache), so both engines read the
same numbers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

from ..paths import cache_root

OUTTYPES = {"F32": "f32", "BF16": "bf16"}


def peer_missing() -> str | None:
    """Why the peer cannot run here (llama-cpp-python or the converter's sentencepiece absent), or None."""
    for module, package in (("llama_cpp", "llama-cpp-python"), ("sentencepiece", "sentencepiece")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (pip install .[peer])"
    return None


def peer_build() -> str | None:
    """The instruction sets llama.cpp was built for (its system info: "AVX2 = 1 | FMA = 1 | ..."), or
    None without it. Build it for an ISA with CMAKE_ARGS (docs/kernels.md, "Peers per ISA")."""
    if peer_missing():
        return None
    import llama_cpp  # optional: the [peer] extra

    return " | ".join(flag for flag in llama_cpp.llama_print_system_info().decode().split(" | ") if "= 1" in flag or "CPU" in flag)


def gguf_fails(gguf: Path, threads: int) -> str | None:
    """Why llama.cpp cannot run ``gguf`` here, or None: one pass in a child process, since a kernel
    built for instructions this CPU lacks stops the process (llama.cpp's Q4_1 path on the Xeon VM:
    SIGILL) rather than raising."""
    code = ("import sys; from specdec_fast.bench.peer import LlamaCppPeer; "
            "LlamaCppPeer(__import__('pathlib').Path(sys.argv[1]), int(sys.argv[2])).timed_pass([1, 2, 3])")
    done = subprocess.run([sys.executable, "-c", code, str(gguf), str(threads)], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return f"llama.cpp stopped on {gguf.name} (exit status {done.returncode}{', SIGILL' if done.returncode == -4 else ''})"


def converter_source() -> Path:
    """llama.cpp's folder from the source distribution of the installed llama-cpp-python (or
    $SPECDEC_LLAMA_CPP_SRC), downloaded and unpacked once into the cache."""
    if os.environ.get("SPECDEC_LLAMA_CPP_SRC"):
        return Path(os.environ["SPECDEC_LLAMA_CPP_SRC"])
    version = importlib.metadata.version("llama-cpp-python")
    root = cache_root() / "llama_cpp_src" / version
    folder = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (folder / "convert_hf_to_gguf.py").is_file():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:",
                        "--no-deps", "--quiet", "-d", str(root)], check=True)
        with tarfile.open(root / f"llama_cpp_python-{version}.tar.gz") as sdist:
            wanted = [m for m in sdist.getmembers() if "/vendor/llama.cpp/" in m.name and (
                m.name.endswith("convert_hf_to_gguf.py") or "/gguf-py/" in m.name or "/conversion/" in m.name)]
            sdist.extractall(root, members=wanted, filter="data")
    return folder


def gguf_file(checkpoint: Path, outtype: str) -> Path:
    """The checkpoint as a GGUF of ``outtype`` ("F32" or "BF16"), converted once into the cache."""
    out = cache_root() / "gguf" / f"{checkpoint.name}-{outtype}.gguf"
    if out.is_file():
        return out
    source = converter_source()
    plain = cache_root() / "gguf" / f"{checkpoint.name}-hf"  # the checkpoint without its GGUF-loading note
    shutil.copytree(checkpoint, plain, dirs_exist_ok=True)
    config = json.loads((plain / "config.json").read_text())
    config.pop("quantization_config", None)
    (plain / "config.json").write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(source / "gguf-py"))
    partial = out.with_suffix(".partial")
    subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(plain), "--outtype", OUTTYPES[outtype],
                    "--outfile", str(partial)], check=True, env=env, capture_output=True)
    partial.rename(out)
    return out


class LlamaCppPeer:
    """One GGUF in llama.cpp with ``threads`` threads: timed passes over a cached prefix, greedy
    decoding of token ids (the same ids our tokenizer makes), and llama-cpp-python's generation
    loop, with its prompt-lookup drafting when ``lookup_tokens`` > 0 (``LlamaPromptLookupDecoding``:
    the target samples at every drafted position and keeps the drafts while its samples match
    them, which is exact for fixed proposals)."""

    def __init__(self, gguf: Path, threads: int, context: int = 2048, lookup_tokens: int = 0):
        import llama_cpp  # optional: the [peer] extra
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self._llama_cpp = llama_cpp
        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        # A draft needs the logits of every position: llama-cpp-python sizes its score buffer by the
        # logits_all argument (n_batch rows without it), so it is passed, not left to draft_model.
        self.llm = llama_cpp.Llama(str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=context, verbose=False,
                                   draft_model=draft, logits_all=draft is not None)

    def hold(self, ids: list[int]) -> None:
        """Fill the cache with ``ids``."""
        self.llm.reset()
        self.llm.eval(ids)

    def timed_pass(self, tokens: list[int]) -> float:
        """Seconds of one pass over ``tokens`` after the held prefix, then rolled back to it."""
        held = self.llm.n_tokens
        start = time.perf_counter()
        self.llm.eval(tokens)
        seconds = time.perf_counter() - start
        self.llm.n_tokens = held
        return seconds

    def greedy(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
        """Greedy decoding of ``max_new_tokens`` after ``ids`` (no early stop): (new ids, seconds,
        the prompt's pass included)."""
        start, new = time.perf_counter(), []
        self.llm.reset()
        self.llm.eval(ids)
        for _ in range(max_new_tokens):
            new.append(int(self._last_logits().argmax()))
            self.llm.eval(new[-1:])
        return new, time.perf_counter() - start

    def generate(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int = 0) -> list[int]:
        """Up to ``max_new_tokens`` tokens after ``ids`` by llama-cpp-python's loop: greedy at
        temperature 0, else plain sampling at ``temperature`` (no top-k, top-p, min-p or penalty)."""
        self.llm.set_seed(seed)
        sampling = dict(temp=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
        new = []
        for token in self.llm.generate(ids, reset=True, **sampling):
            new.append(int(token))
            if len(new) == max_new_tokens:
                break
        return new

    def _last_logits(self) -> np.ndarray:
        """The logits [V] of the last token evaluated (llama.cpp keeps only those without logits_all)."""
        return np.ctypeslib.as_array(self._llama_cpp.llama_get_logits(self.llm.ctx), shape=(self.llm.n_vocab(),))
