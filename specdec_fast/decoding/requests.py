"""What every decoding loop does with a request before and after its rounds: the prompt as
token ids, the end-of-sequence ids, the budget checks, and the text of the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from .outputs import GenerationStats


@dataclass
class Request:
    """One request being decoded: its committed tokens (prompt first), budget, randomness, counters."""

    ids: list[int]
    max_new_tokens: int
    generator: torch.Generator
    stats: GenerationStats

    @property
    def remaining(self) -> int:
        """New tokens it may still emit."""
        return self.max_new_tokens - self.stats.new_tokens

    @property
    def new_tokens(self) -> list[int]:
        return self.ids[self.stats.prompt_tokens :]


def chat_prompt_ids(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of ``prompt``, wrapped in the tokenizer's chat template (as one user turn, with
    the assistant's turn opened) when ``chat`` and the tokenizer has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(prompt).input_ids


def prompt_ids(input_ids: Tensor | Sequence[int] | None, prompt: str | None, tokenizer) -> list[int]:
    """The prompt's token ids from ``input_ids`` ([S] or [1, S]) or ``prompt`` text + ``tokenizer``."""
    if (input_ids is None) == (prompt is None):
        raise ValueError("pass exactly one of input_ids or prompt")
    if prompt is not None:
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        input_ids = tokenizer(prompt).input_ids
    ids = torch.as_tensor(input_ids, dtype=torch.int64)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"input_ids must have shape [S] or [1, S], got {list(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("empty prompt: at least one token is needed to condition on")
    return ids.tolist()


def eos_ids(eos_token_id: int | Sequence[int] | None, model, tokenizer) -> set[int]:
    """End-of-sequence ids: ``eos_token_id`` if given (``()`` disables stopping), else the
    model's generation config, else the tokenizer's."""
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}


def check_budget(ids: list[int], max_new_tokens: int, lms: Sequence) -> None:
    """``max_new_tokens`` is a positive integer, the prompt's ids are in every model's vocabulary,
    and the prompt plus the budget fit in every model's context."""
    if int(max_new_tokens) != max_new_tokens or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
    for lm in lms:
        if max(ids) >= lm.vocab_size or min(ids) < 0:
            raise ValueError(f"prompt has token ids outside [0, {lm.vocab_size})")
        if lm.max_length is not None and len(ids) + max_new_tokens > lm.max_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's context of {lm.max_length} tokens"
            )


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-sequence id."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def decode_text(tokenizer, tokens: list[int]) -> str | None:
    """The text of ``tokens`` (special tokens skipped), or None without a tokenizer."""
    return tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None
