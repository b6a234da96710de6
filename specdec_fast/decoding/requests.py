"""What every decoding loop does with a request before and after its rounds: the prompt as
token ids, the end-of-sequence ids, the budget checks, and the text of the result."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..drafts.binding import draft_kind
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


def chat_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of a chat (``[{"role": ..., "content": ...}, ...]``) in the tokenizer's chat template,
    with the assistant's turn opened for the reply."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages need a tokenizer with a chat template")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def chat_prompt_ids(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of ``prompt`` as one user turn of a chat (:func:`chat_ids`) when ``chat`` and the
    tokenizer has a template, else of the raw text."""
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer(prompt).input_ids


def _unpadded(ids: Tensor, mask, row: int | None = None) -> list[int]:
    """The tokens of one row whose attention mask is 1 (padding on either side dropped); a hole
    inside the row is an error."""
    if mask is None:
        return ids.tolist()
    mask = torch.as_tensor(mask)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask has shape {list(mask.shape)}, input_ids {list(ids.shape)}")
    kept = mask.nonzero().flatten().tolist()
    where = f" in row {row}" if row is not None else ""
    if kept and kept[-1] - kept[0] + 1 != len(kept):
        raise ValueError(f"attention_mask has a hole inside the sequence{where}: only padding at either end is supported")
    return ids[kept].tolist()


def _split_encoding(input_ids, attention_mask):
    """``input_ids`` as given, or taken out of a dict / BatchEncoding with its attention mask."""
    if hasattr(input_ids, "keys") and "input_ids" in input_ids:
        if attention_mask is not None:
            raise ValueError("pass the attention mask once: inside the encoding or as attention_mask, not both")
        return input_ids["input_ids"], input_ids.get("attention_mask")
    return input_ids, attention_mask


def prompt_ids(input_ids=None, prompt: str | None = None, tokenizer=None, messages: Sequence[dict] | None = None,
               attention_mask=None) -> list[int]:
    """One prompt's token ids from exactly one of: ``input_ids`` ([S] or [1, S], or a dict /
    BatchEncoding holding ``input_ids`` and perhaps ``attention_mask``), ``prompt`` (raw text,
    tokenized as it is: no chat template) or ``messages`` (a chat, see :func:`chat_ids`)."""
    if sum(x is not None for x in (input_ids, prompt, messages)) != 1:
        raise ValueError("pass exactly one of input_ids, prompt or messages")
    if messages is not None:
        return chat_ids(tokenizer, messages)
    if prompt is not None:
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        return tokenizer(prompt).input_ids
    input_ids, attention_mask = _split_encoding(input_ids, attention_mask)
    ids = torch.as_tensor(input_ids)
    if ids.numel() == 0:
        raise ValueError("empty prompt: at least one token is needed to condition on")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got {ids.dtype}")
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
        attention_mask = None if attention_mask is None else torch.as_tensor(attention_mask).reshape(ids.shape)
    if ids.dim() != 1:
        raise ValueError(f"input_ids must have shape [S] or [1, S], got {list(ids.shape)}"
                         + ("; for several prompts use batch_generate" if ids.dim() == 2 else ""))
    if attention_mask is not None and not bool(torch.as_tensor(attention_mask).bool().all()):
        raise ValueError("attention_mask has zeros: one sequence takes no padding (pass padded batches to batch_generate)")
    return ids.long().tolist()


def batch_prompt_ids(input_ids=None, prompts: Sequence[str] | None = None, tokenizer=None,
                     messages: Sequence[Sequence[dict]] | None = None, attention_mask=None) -> list[list[int]]:
    """The token ids of each request from exactly one of: ``input_ids`` (B sequences of ids, or a
    padded [B, S] tensor or BatchEncoding with its ``attention_mask``: padding on either side is
    dropped), ``prompts`` (B raw texts) or ``messages`` (B chats)."""
    if sum(x is not None for x in (input_ids, prompts, messages)) != 1:
        raise ValueError("pass exactly one of input_ids, prompts or messages")
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of strings (one per request), got a single string")
    if prompts is not None:
        requests = [prompt_ids(prompt=p, tokenizer=tokenizer) for p in prompts]
    elif messages is not None:
        requests = [prompt_ids(messages=m, tokenizer=tokenizer) for m in messages]
    else:
        input_ids, attention_mask = _split_encoding(input_ids, attention_mask)
        if isinstance(input_ids, Tensor) and input_ids.dim() == 2:
            input_ids = [_unpadded(row, None if attention_mask is None else torch.as_tensor(attention_mask)[b], b)
                         for b, row in enumerate(input_ids)]
        elif attention_mask is not None:
            raise ValueError("attention_mask goes with a padded [B, S] tensor of input_ids")
        requests = [prompt_ids(ids) for ids in input_ids]
    if not requests:
        raise ValueError("empty batch: pass at least one prompt")
    return requests


def check_budget(ids: list[int], max_new_tokens: int, lms: Sequence) -> None:
    """The prompt's ids are in every model's vocabulary, and the prompt plus ``max_new_tokens`` (a
    budget :func:`~specdec_fast.decoding.config.generation_settings` has checked) fit in every
    model's context."""
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


def check_policy(policy, draft) -> None:
    """Warn (once per kind) when a learned policy meets a draft of another kind than it learnt from:
    the output stays exact, but its acceptance predictions describe another draft."""
    trained_for = getattr(policy, "trained_for", None)
    if trained_for is not None and draft is not None and trained_for != draft_kind(draft):
        _warn_once(f"specdec_fast: this policy learnt from a {trained_for} draft and now drafts with a "
                   f"{draft_kind(draft)} draft; the output stays exact, the draft lengths may not suit it "
                   f"(default_policy(draft=...) picks the one for the draft)")


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)
