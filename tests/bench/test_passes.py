"""The pass benchmark (``specdec-fast pass-bench``): every engine's cells, the bandwidth bound,
the decoding side by side; llama.cpp skipped with a message where it is absent."""

from __future__ import annotations

import importlib.util
import json

import pytest

from specdec_fast.bench import passes, peer
from specdec_fast.cli import main


def test_the_peer_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert peer.peer_missing() == "llama-cpp-python is not installed (pip install .[peer])"


@pytest.mark.slow
def test_pass_bench_without_the_peer(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(passes, "peer_missing", lambda: "llama-cpp-python is not installed (pip install .[peer])")
    status = main(["pass-bench", "--repeats", "1", "--prompts", "1", "--max-new-tokens", "4", "--decode-repeats", "1",
                   "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0 and "llama.cpp peer skipped: llama-cpp-python is not installed" in out
    assert {p.name for p in tmp_path.iterdir()} == {"passes.json", "passes.md", "passes.png"}
    data = json.loads((tmp_path / "passes.json").read_text())
    engines = {r["engine"] for r in data["passes"]}
    assert engines == {"transformers eager", "skinny + packed GQA", "lean fp32", "lean fp32 (A/A)", "lean fp32-dense", "lean bf16",
                       "lean int8", "lean q8"}
    assert all(0 < r["of_bound"] and r["ms_1"] > 0 and len(r["v"]) == len(passes.SIZES) for r in data["passes"])
    bytes_read = data["weight_bytes"]  # the checkpoint's 4-bit blocks < bf16 < whole fp32 matrices
    assert bytes_read["fp32"] < bytes_read["bf16"] < bytes_read["fp32-dense"] and data["read_bandwidth_gbps"] > 0
    assert [(r["draft"], r["cached"]) for r in data["draft_steps"]] == [
        (f"feature draft, {name}", c) for name in ("transformers", "lean path (int8)") for c in passes.CACHED]
    assert all(r["ms"] > 0 for r in data["draft_steps"]) and "The shipped feature draft's step" in out
    assert set(data["decode"]["tokens_per_s"]) >= {"transformers generate", "autoregressive, lean fp32", "autoregressive, lean fp32-dense",
                                                   "autoregressive, lean q8"}
