"""The workload benchmark's prompt sets (held-out and tuning halves, disjoint and stable) and the
benchmark itself, end to end on one prompt."""

from __future__ import annotations

import json

import pytest

from specdec_fast.bench.peer import peer_missing
from specdec_fast.bench.workload import OURS
from specdec_fast.cli import main
from specdec_fast.data.workload import CATEGORIES, workload_prompts


@pytest.mark.parametrize("category", CATEGORIES)
def test_the_halves_are_disjoint_stable_and_end_with_a_user_turn(category):
    held, tuning = workload_prompts(category), workload_prompts(category, "tuning")
    assert len(held) >= 20 and len(tuning) >= 15
    assert not {json.dumps(c) for c in held} & {json.dumps(c) for c in tuning}
    assert workload_prompts(category) == held
    assert all(chat[-1]["role"] == "user" for chat in held + tuning)


def test_grounded_prompts_carry_their_context():
    chats = workload_prompts("grounded")
    assert any("```python" in c[-1]["content"] for c in chats) and all(len(c[-1]["content"]) > 200 for c in chats)
    assert all(c[1]["role"] == "assistant" and len(c[1]["content"]) >= 300 for c in workload_prompts("multi-turn"))


def test_bad_names():
    with pytest.raises(ValueError, match="category must be one of chat, grounded, multi-turn"):
        workload_prompts("poetry")
    with pytest.raises(ValueError, match="split must be"):
        workload_prompts("chat", "train")


@pytest.mark.slow
def test_the_benchmark_runs_every_engine(capsys, tmp_path):
    status = main(["bench", "--workload", "--categories", "grounded", "--prompts", "1", "--temperatures", "0",
                   "--max-new-tokens", "8", "--out", str(tmp_path)])
    assert status == 0
    data = json.loads((tmp_path / "workload.json").read_text())
    engines = {r["engine"] for r in data["rows"]}
    peers = {"llama.cpp (F32)", "llama.cpp prompt lookup (F32)"} if peer_missing() is None else set()
    assert engines - peers == {"transformers generate", "transformers prompt lookup", "transformers assisted (token draft)",
                               *OURS}
    assert engines & peers == peers  # with the [peer] extra installed, llama.cpp runs beside
    ours = [r for r in data["rows"] if r["engine"] in OURS]
    # at most a pass per new token and one more for the prompt (all but its last token, then the last)
    assert all(r["passes_per_token"] is not None and 0 < r["passes_per_token"] <= (8 + 1) / 8 for r in ours)
    assert next(r for r in ours if r["engine"] == "autoregressive")["passes_per_token"] == (8 + 1) / 8
    assert all(0 < r["prompt_share"] < 1 and r["after_prompt_tokens_per_s"] > r["tokens_per_s"] for r in ours)
    assert all(r["prompt_share"] is None for r in data["rows"] if r["engine"] not in OURS)
    assert next(r for r in ours if r["engine"] == "autoregressive")["after_prompt_vs_autoregressive"] == 1
    assert {p.name for p in tmp_path.iterdir()} == {"workload.json", "workload.md", "workload.png"}


@pytest.mark.slow
def test_our_engines_alone_on_whole_fp32_matrices(tmp_path):
    """--no-peers --lean fp32-dense: ours only, on the memory-bound path, written as workload_dense; each
    engine's ratio to our loop is the median of its per-block ratios (one block here: the ratio itself)."""
    assert main(["bench", "--workload", "--no-peers", "--lean", "fp32-dense", "--categories", "chat", "--prompts", "1",
                 "--temperatures", "1", "--max-new-tokens", "8", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "workload_dense.json").read_text())
    assert {r["engine"] for r in data["rows"]} == set(OURS) and data["settings"]["lean"] == "fp32-dense"
    assert all(r["vs_autoregressive"] == r["vs_autoregressive_all"][0] for r in data["rows"])
    assert "fp32 read as whole matrices" in (tmp_path / "workload_dense.md").read_text()


@pytest.mark.slow
def test_the_batched_benchmark_runs_our_engines_in_batches(capsys, tmp_path):
    status = main(["bench", "--workload", "--batch", "2", "--categories", "grounded", "--prompts", "2", "--temperatures", "0",
                   "--max-new-tokens", "8", "--out", str(tmp_path)])
    assert status == 0
    data = json.loads((tmp_path / "workload_batch2.json").read_text())
    assert {r["engine"] for r in data["rows"]} == {"autoregressive", "autoregressive (A/A)", "feature draft", "prompt lookup",
                                                  "hybrid"}
    assert data["settings"]["batch"] == 2 and data["settings"]["prompt_counts"] == {"grounded": 2}
    passes = {r["engine"]: r["passes_per_token"] for r in data["rows"]}  # (the prefill counts: 9 passes for 8 tokens)
    # (the guard opens with a one-token probe: in 8 tokens the lookup may not get past it)
    assert passes["prompt lookup"] <= passes["autoregressive"] == passes["autoregressive (A/A)"] == 9 / 8
    assert main(["bench", "--workload", "--batch", "3", "--prompts", "2", "--out", str(tmp_path)]) == 2
    assert "batch must be in 1..prompts (2), got 3" in capsys.readouterr().err
