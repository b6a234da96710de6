"""The command line as a user meets it: one-line errors with exit status 2 before any model loads,
every default in --help, and benchmarks and training that write where they are told (never into
the package or the checkout)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import specdec_fast
from specdec_fast.cli import main
from specdec_fast.models.smollm2 import smollm2_path

from helpers.models import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(specdec_fast.__file__).resolve().parent


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The console command, in a process of its own."""
    env = dict(os.environ, SPECDEC_FAST_VERBOSE="")
    return subprocess.run([sys.executable, "-m", "specdec_fast.cli", *args], capture_output=True, text=True, cwd=cwd, env=env)


def run(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the command run in this process (faster: no imports)."""
    try:
        status = main(list(args))
    except SystemExit as stop:
        status = stop.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("args,message", [
    (["--target", "/nonexistent"], "--target /nonexistent: no such file or folder"),
    (["--target", "."], "is not a transformers checkpoint folder"),
    (["--alternatives", "2", "--verifier", "block"], "--alternatives needs --verifier token"),
    (["--draft", "early-exit"], "--draft early-exit needs --draft-layers"),
    (["--top-p", "1.5"], "--top-p 1.5 is out of range"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--draft-model", "/nonexistent"], "--draft-model /nonexistent: no such file or folder"),
])
def test_generate_errors_are_one_line_before_loading(capsys, monkeypatch, args, message):
    monkeypatch.setattr("specdec_fast.cli.generate.load_smollm2", lambda: pytest.fail("a model was loaded"))
    status, _, err = run(capsys, "generate", "--prompt", "hi", *args)
    assert status == 2 and err.count("\n") == 1 and message in err, err


def test_the_console_command_prints_one_line_and_exits_2():
    done = cli("generate", "--prompt", "hi", "--target", "/nonexistent")
    assert done.returncode == 2 and done.stderr == "specdec-fast generate: error: --target /nonexistent: no such file or folder\n"


def test_a_target_of_ones_own_needs_a_draft_of_its_kind(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    status, _, err = run(capsys, "generate", "--prompt", "hi", "--target", str(tmp_path))
    assert status == 2 and "needs a draft: --draft-model" in err and err.count("\n") == 1
    status, _, err = run(capsys, "generate", "--prompt", "hi", "--target", str(tmp_path), "--draft", "feature")
    assert status == 2 and "a draft shipped for SmolLM2" in err


def test_help_shows_every_default(capsys):
    text = run(capsys, "generate", "--help")[1].split("options:", 1)[1]
    blocks = re.split(r"\n(?=  -)", text.strip("\n"))
    assert len(blocks) >= 16
    for block in blocks:
        if not block.lstrip().startswith("-h"):
            assert "(default:" in " ".join(block.split()), f"no default shown: {block}"


def snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_a_benchmark_writes_into_its_out_folder_only(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = snapshot(PACKAGE), snapshot(ROOT / "benchmarks")
    status, out, err = run(capsys, "microbench", "--batches", "1", "--lengths", "1", "--vocabs", "1000", "--dtypes", "float32",
                           "--repeats", "1", "--out", "res")
    assert status == 0, err
    assert {p.name for p in (tmp_path / "res").iterdir()} == {"microbench.json", "microbench.md", "microbench.png"}
    assert "results: res/microbench.json" in out
    assert (snapshot(PACKAGE), snapshot(ROOT / "benchmarks")) == before


def test_training_refuses_to_overwrite_a_shipped_artifact(capsys):
    status, _, err = run(capsys, "train-policy", "--out", str(PACKAGE / "data" / "policy.safetensors"))
    assert status == 2 and "pass --replace-shipped" in err and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["feature", "lookup"])
def test_training_writes_into_its_out_folder_only(tmp_path, draft):
    """A small train-policy run (the real pair, or the lookup's chooser; 5 prompts, 8 tokens): the
    file lands in --out."""
    before = snapshot(PACKAGE), snapshot(ROOT / "benchmarks")
    out = tmp_path / "policy.safetensors"
    done = cli("train-policy", "--draft", draft, "--prompts", "5", "--max-new-tokens", "8", "--max-draft", "2",
               "--temperatures", "0", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.is_file() and {p.name for p in tmp_path.iterdir()} == {"policy.safetensors"}
    assert (snapshot(PACKAGE), snapshot(ROOT / "benchmarks")) == before


@pytest.mark.slow
def test_a_pair_of_ones_own(tmp_path, capsys):
    """--target DIR --draft-model DIR: two small random Llamas with SmolLM2's tokenizer, with the
    target alone beside (--baseline); and --draft early-exit with the same target."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    for name, layers, seed in (("target", 2, 0), ("draft", 1, 1)):
        model = tiny_llama(seed, vocab=len(tokenizer), layers=layers, context=512)
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    common = ["generate", "--prompt", "hi", "--max-new-tokens", "12", "--json", "--baseline", "--target", str(tmp_path / "target")]
    status, out, err = run(capsys, *common, "--draft-model", str(tmp_path / "draft"))
    report = json.loads(out[out.index("{"):])
    assert status == 0 and report["speculative"]["new_tokens"] == 12, err
    assert report["speculative"]["drafted"] > 0 and report["autoregressive"]["new_tokens"] == 12
    status, out, err = run(capsys, *common, "--draft", "early-exit", "--draft-layers", "1")
    assert status == 0 and json.loads(out[out.index("{"):])["speculative"]["new_tokens"] == 12, err
